# The two front-door commands (see README.md): `make demo` and `make test`.
.PHONY: demo test setup system-deps

setup:
	@scripts/setup

system-deps:
	@scripts/system-deps

demo: setup
	.venv/bin/swarm-monitor demo $(ARGS)

test: setup system-deps
	.venv/bin/python -m pytest $(ARGS)
