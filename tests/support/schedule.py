"""pytest plugin: with --dist loadfile --no-loadscope-reorder, the longest files start first.

pytest-xdist hands a worker one file at a time, in the order of the collection (with
--no-loadscope-reorder; by default, the files with the most tests first). A long file handed
out late runs on while the other workers have finished: the lane's wall time is then that
file's, not the work's share of a worker. Started first, the long files overlap each other
and the short ones fill the gaps at the end.
"""

from __future__ import annotations

import os

import pytest

# Seconds per file (setup, calls and teardown summed), from `--durations=0` of the rest lane
# on 2 cores. Only the order matters: a stale figure costs minutes, never a result. A file
# not listed weighs PER_TEST a test.
WEIGHTS = {
    "bench/test_bench_smoke.py": 110,
    "backends/postgres/test_process.py": 89,
    "jobs/test_once_per.py": 86,
    "backends/etcd/test_process.py": 69,
    "deploy/test_image.py": 68,  # and a first build of the image: about a minute
    "process/test_priority.py": 66,
    "process/test_switchover.py": 65,
    "process/test_members.py": 58,
    "backends/kubernetes/test_faults.py": 57,
    "process/test_health.py": 56,
    "supervisor/test_run.py": 56,
    "supervisor/test_escape.py": 51,
    "safety/test_sqlite_crash_failover.py": 51,
    "process/test_switchover_any_node.py": 51,
    "backends/test_contract_records.py": 47,
    "process/test_daemon.py": 42,
    "deploy/test_balancers.py": 41,
    "examples/test_examples.py": 35,
    "process/test_commands.py": 33,
    "process/test_early_signals.py": 25,
    "supervisor/test_last_guard.py": 33,
    "backends/test_contract.py": 33,
    "supervisor/test_keeper.py": 31,
    "safety/test_sqlite_safety.py": 30,
    "deploy/test_systemd_boot.py": 29,
    "backends/postgres/test_late_release.py": 27,
    "backends/test_reservation.py": 26,
    "backends/test_grant.py": 26,
    "deploy/test_container.py": 24,
    "jobs/test_hooks.py": 22,
    "backends/kubernetes/test_takeover.py": 19,
    "process/test_run_exit.py": 18,
    "backends/kubernetes/test_interop.py": 18,
    "backends/postgres/test_clock_step.py": 16,
    "deploy/test_packaging.py": 14,
    "model/test_model.py": 14,
    "backends/postgres/test_durability.py": 12,
    "process/test_cli.py": 12,
    "process/test_limits.py": 12,
    "jobs/test_store.py": 11,
    "backends/postgres/test_advisory.py": 6,
    "backends/postgres/test_advisory_session.py": 5,
    "backends/etcd/test_late_release.py": 10,
    "backends/postgres/test_steady_load.py": 10,
    "backends/etcd/test_revoked_slow_holder.py": 10,
}
PER_TEST = 0.5
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def weight(path: str, tests: int) -> float:
    return WEIGHTS.get(os.path.relpath(path, TESTS), PER_TEST * tests)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Only where pytest-xdist is told to keep the collection's order (a worker's own "dist"
    # option always reads "no").
    if config.getoption("loadscopereorder", True):
        return
    counts: dict[str, int] = {}
    for item in items:
        counts[str(item.path)] = counts.get(str(item.path), 0) + 1
    # A stable sort: each file's tests keep their order, and files of equal weight theirs.
    items.sort(key=lambda item: -weight(str(item.path), counts[str(item.path)]))
