# The two commands the README puts first:
#   make run    leaderd on its embedded default (SQLite), in the foreground
#   make test   everything CI checks: installs what it needs, lint, types, the whole test suite
PYTHON ?= python3

.PHONY: run test deps lint check bench chaos

run:
	$(PYTHON) -m pip install -q --disable-pip-version-check -e .
	leaderd

deps:
	bash .ci/install-deps.sh

lint:
	$(PYTHON) -m ruff check leaderd tests bench
	$(PYTHON) -m ruff format --check leaderd tests bench
	$(PYTHON) -m mypy

test: deps lint
	$(PYTHON) -m pytest -ra

bench:
	$(PYTHON) -m bench

chaos:
	$(PYTHON) -m tests.chaos --duration 1800
