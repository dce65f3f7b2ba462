# The two front-door commands (see README.md): `make demo` and `make test`.
# `make test-fast`: the specs that need no swarm, PostgreSQL, browser or Redis (markers: pyproject.toml).
# `make lint`: ruff over every Python file, then mypy over the typed layers (pyproject.toml: [tool.ruff],
# [tool.mypy]); `make test` runs it first. `make types-all`: mypy over every package.
.PHONY: demo test test-fast lint types-all setup system-deps

setup:
	@scripts/setup

system-deps:
	@scripts/system-deps

demo: setup
	.venv/bin/swarm-monitor demo $(ARGS)

# Spec modules run on WORKERS processes (pytest-xdist; a module stays on one, with its fixtures, the
# longest first: tests/conftest.py), two by default for the two cores; WORKERS=0 runs them all in
# this process (BENCHMARKS.md, "Test suite": the times of both).
WORKERS ?= 2
PYTEST = .venv/bin/python -m pytest $(if $(filter-out 0,$(WORKERS)),-n $(WORKERS) --dist loadfile --no-loadscope-reorder)

lint: setup
	.venv/bin/ruff check monitor chat client scripts tests
	.venv/bin/mypy

types-all: setup  # the types of every package, the layers not in [tool.mypy] files yet too
	.venv/bin/mypy monitor chat client/swarm_monitor_client

test: setup system-deps lint
	$(PYTEST) $(ARGS)

test-fast: setup
	$(PYTEST) -m "not swarm and not postgres and not browser and not redis" $(ARGS)
