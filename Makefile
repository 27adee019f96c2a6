# The two commands the README puts first:
#   make run    leaderd on its embedded default (SQLite), in the foreground
#   make test   everything CI checks: installs what it needs, lint, types, the whole test suite
#               (the fast lane first, so a broken rule shows in minutes; then all the rest,
#               on three workers; the chaos runs last, two decks at a time)
#   make test-fast  the fast lane alone: engine, rules, config, API, the contract on SQLite
# Both work in a virtual environment (.venv), so they never touch the system Python
# (Debian 12 and Ubuntu refuse `pip install` there: "externally managed environment").
SYSTEM_PYTHON ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python

.PHONY: run test test-fast deps venv lint check bench chaos

# The 25 slowest tests in every log: where the suite's time goes.
PYTEST := $(PYTHON) -m pytest -ra --durations=25

# Bytecode is cached: with PYTHONDONTWRITEBYTECODE (set in some CI images), every pytest
# worker rewrote and compiled every test module again (8 s of CPU per worker and lane, two
# thirds of its collection), and every test daemon compiled the leaderd modules it imports.
unexport PYTHONDONTWRITEBYTECODE

# The venv is made once; `python3 -m venv` needs Debian's python3-venv, installed here if missing.
$(PYTHON):
	SYSTEM_PYTHON=$(SYSTEM_PYTHON) VENV=$(VENV) bash .ci/make-venv.sh

venv: $(PYTHON)

run: $(PYTHON)
	$(PYTHON) -m pip install -q --disable-pip-version-check -e .
	$(VENV)/bin/leaderd

deps: $(PYTHON)
	PYTHON=$(abspath $(PYTHON)) bash .ci/install-deps.sh

lint: $(PYTHON)
	$(PYTHON) -m ruff check leaderd tests bench
	$(PYTHON) -m ruff format --check leaderd tests bench
	$(PYTHON) -m mypy

# On two cores: the fast lane is busy on the CPU and gets two workers; the rest mostly waits
# on real daemons, servers and ttls (half the CPU idle with two workers) and gets three; a
# fourth made the lane slower (every test's daemons then wait for a core). A test that judges
# an order of events must force it, so a third worker cannot make it fail. Every
# fixture is per process (free ports, its own temporary directories), so the workers share
# nothing but the machine. The rest goes a test file to each worker at a time (a file's
# fixtures start once); the fast lane test by test, since schemathesis gives all its cases one
# node id, which --dist loadfile would run once (tests/conftest.py refuses that). The chaos
# runs come last, two decks at a time and nothing else: their liveness bound is a time, and a
# deck uses about half a core, so two share the machine but a busy neighbour's would not. They
# are handed out longest first (the order of tests/chaos/test_chaos.py).
# The rest's longest files start first (tests/support/schedule.py), so none starts last and
# runs on alone: --no-loadscope-reorder keeps that order, not pytest-xdist's (most tests first).
FAST := -m fast -n 2 --dist load
REST := -m "not fast and not chaos" -n 3 --dist loadfile --no-loadscope-reorder

test: deps lint
	$(PYTEST) $(FAST)
	$(PYTEST) $(REST)
	$(PYTEST) -m "chaos and not fast" -n 2 --dist load

test-fast: $(PYTHON)
	$(PYTHON) -m pip install -q --disable-pip-version-check -e '.[test]'
	$(PYTEST) $(FAST)

bench: $(PYTHON)
	$(PYTHON) -m bench

chaos: $(PYTHON)
	$(PYTHON) -m tests.chaos --duration 1800
