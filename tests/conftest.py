"""Shared test set-up: the PostgreSQL server plugin, no daemon outliving its test, and none
of this host's leaderd state in reach."""

import collections
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.daemons import Daemon

pytest_plugins = ["tests.support.pg_fixtures", "tests.support.schedule"]

# What a leaderd falls back to without flags, pointed away from this host's own leaderd:
# its configuration file (/etc/leaderd/leaderd.toml), its socket and state directories
# (/run/leaderd, /var/lib/leaderd as root) and its node id (the host name). Every process
# a test starts inherits this environment; a test that means a default sets its own.
_PRIVATE = tempfile.mkdtemp(prefix="leaderd-tests-")
HOST_DEFAULTS = {
    "LEADERD_CONFIG": os.devnull,
    "RUNTIME_DIRECTORY": os.path.join(_PRIVATE, "run"),
    "STATE_DIRECTORY": os.path.join(_PRIVATE, "state"),
    "HOSTNAME": "leaderd-test-node",
}


def pytest_configure(config: pytest.Config) -> None:
    os.environ.update(HOST_DEFAULTS)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_PRIVATE, ignore_errors=True)


# The fast lane (`make test-fast`, and first in `make test`): the rules, in about three
# minutes. Whole directories and files under tests/, and the contract suite on the backends
# that need no server.
FAST_PATHS = ("engine/", "api/", "startup/test_config.py", "startup/test_config_fuzz.py")
FAST_PATHS += ("repository/test_structure", "repository/test_host_isolation.py")
FAST_PATHS += ("repository/test_cited_paths.py",)
FAST_CONTRACT = ("backends/test_contract.py", "backends/test_contract_records.py")
FAST_BACKENDS = ("sqlite", "static", "static-with-term-file")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = os.path.dirname(__file__)
    for item in items:
        where = os.path.relpath(item.path, tests)
        callspec = getattr(item, "callspec", None)
        on_embedded = callspec is not None and callspec.params.get("store") in FAST_BACKENDS
        if where.startswith(FAST_PATHS) or (where.startswith(FAST_CONTRACT) and on_embedded):
            item.add_marker(pytest.mark.fast)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, on the controller
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """pytest-xdist's --dist loadfile schedules by node id: of tests that share one, all but
    one would be dropped without a word. (schemathesis names all its cases alike: the fast
    lane, where they are, runs with --dist load.)"""
    if node.config.getoption("dist") != "loadfile":
        return
    shared = sorted(nodeid for nodeid, count in collections.Counter(ids).items() if count > 1)
    if shared:
        raise pytest.UsageError(f"--dist loadfile would run only one test of each of {shared}")


_LOG_TAIL = 80  # lines of each daemon's log a failed test's report carries


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's report carries the tail of each of its daemons' logs: CI keeps no
    work directory, and a race that fails once in many runs must be readable from one."""
    report = yield
    if report.failed:
        for daemon in Daemon.started:
            tail = daemon.log().splitlines()[-_LOG_TAIL:]
            report.sections.append((f"{daemon.node_id}'s log ({daemon.log_path})", "\n".join(tail)))
    return report


@pytest.fixture(autouse=True)
def no_daemon_left_behind() -> Iterator[None]:
    """A test that fails half-way must not leave its daemons running."""
    yield
    while Daemon.started:
        Daemon.started.pop().kill()
