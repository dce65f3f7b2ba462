# The two front-door commands (see README.md): `make demo` and `make test`.
# `make test-fast`: the specs that need no swarm, PostgreSQL or browser (markers: pyproject.toml).
.PHONY: demo test test-fast setup system-deps

setup:
	@scripts/setup

system-deps:
	@scripts/system-deps

demo: setup
	.venv/bin/swarm-monitor demo $(ARGS)

test: setup system-deps
	.venv/bin/python -m pytest $(ARGS)

test-fast: setup
	.venv/bin/python -m pytest -m "not swarm and not postgres and not browser" $(ARGS)
