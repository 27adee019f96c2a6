"""Issue #10, path 7: nothing the command starts may outlive its supervision.

Each job forks workers (job.py --setsid-worker, --fork-worker) that share its flock and
ignore SIGTERM: a daemonizing program, the hardest case for a process group. While any
worker lives, the job's lock is held, so a successor's job that starts beside it says
"busy" — the kernel's proof of two jobs at once.

Tests on ``contained`` run once per containment (a PID namespace, a delegated cgroup, a
process group with subreapers); those on ``cluster`` need what only a PID namespace gives.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import time

import pytest

from tests.support.daemons import wait_for
from tests.support.supervision.cluster import Cluster, wait_dead
from tests.support.supervision.records import (
    LEASE_WINDOW,
    alive,
    check_one_job_at_a_time,
    children,
    events,
    keeper_of,
    lock_free,
    tree,
)

pytestmark = pytest.mark.slow


def test_keeper_killed_takes_the_whole_tree_and_is_an_internal_failure(contained: Cluster) -> None:
    cluster = contained
    job, pids = cluster.start_job("a", "--setsid-worker", "--fork-worker")
    a = cluster.daemon("a")
    b = cluster.start("b")
    b.wait_ready()
    killed = time.monotonic()
    os.kill(keeper_of(a.pid), signal.SIGKILL)
    gone = max(wait_dead(pid, timeout=5) for pid in (job, *pids)) - killed
    # The daemon names it an internal failure, and releases only once the tree is gone.
    assert a.wait(15) == 1
    log = a.log()
    assert "internal failure" in log
    assert "releasing election" not in log, "a dead keeper is not the child's exit"
    assert "released election default" in log
    second = cluster.next_start(after=events(cluster.workdir, "start")[0].term)
    print(f"{cluster.containment}: keeper SIGKILLed, the whole tree gone in {gone:.3f}s")
    assert second.node == "b"
    check_one_job_at_a_time(cluster.workdir)


@pytest.mark.parametrize("how", ["resign", "backend_lost"])
def test_frozen_keeper_cannot_keep_workers_past_a_step_down(contained: Cluster, how: str) -> None:
    """Once the lease is free on the backend (released, or expired on the backend's clock),
    a successor's job may start: by then no process of the tree may hold the job's lock.
    The kernel's flock judges it at that instant, not this test's polling, which a loaded
    host ran 0.6 s after the worker's last tick."""
    cluster = contained
    job, pids = cluster.start_job("a", "--setsid-worker")
    a = cluster.daemon("a")
    keeper = keeper_of(a.pid)
    os.kill(keeper, signal.SIGSTOP)
    locker = sqlite3.connect(cluster.db, timeout=10, isolation_level=None)
    try:
        if how == "resign":  # leaderd releases only once the tree is gone
            assert a.post("/resign")[0] == 200
            wait_for(lambda: "released election default" in a.log(), 15, what="the release")
        else:  # every renewal fails from now on: the lease row, read inside, is the last one
            locker.execute("BEGIN EXCLUSIVE")
            row = "SELECT expires_boottime FROM leaderd_lease WHERE election = 'default'"
            (expires,) = locker.execute(row).fetchone()
            time.sleep(max(0.0, expires - time.clock_gettime(time.CLOCK_BOOTTIME)))
        free = lock_free(cluster.workdir)
    finally:
        with contextlib.suppress(sqlite3.Error):
            locker.execute("ROLLBACK")
        locker.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(keeper, signal.SIGCONT)
    assert free, f"{how}: the job's lock was still held when the lease was free"
    for pid in (job, *pids):
        wait_dead(pid, timeout=5)
    assert a.alive(), "the daemon stopped the tree itself: no failure"
    check_one_job_at_a_time(cluster.workdir)


def test_daemon_and_keeper_killed_together_take_every_worker(cluster: Cluster) -> None:
    job, pids = cluster.start_job("a", "--setsid-worker", "--fork-worker")
    a = cluster.daemon("a")
    keeper = keeper_of(a.pid)
    killed = time.monotonic()
    os.kill(a.pid, signal.SIGKILL)
    os.kill(keeper, signal.SIGKILL)
    gone = max(wait_dead(pid, timeout=5) for pid in (job, *pids)) - killed
    print(f"daemon and keeper SIGKILLed together: the tree gone in {gone:.3f}s")


def test_keeper_killed_while_the_daemon_is_frozen(contained: Cluster) -> None:
    """The attacker's order: freeze leaderd first, then kill the keeper. In a PID namespace
    the kernel ends the tree at once; without one, a worker that left the command lives
    until leaderd wakes up (docs/run.md, "Who ends the tree when something fails"), and not
    a moment more."""
    cluster = contained
    job, pids = cluster.start_job("a", "--setsid-worker", "--fork-worker")
    a = cluster.daemon("a")
    keeper = keeper_of(a.pid)
    os.kill(a.pid, signal.SIGSTOP)
    try:
        killed = time.monotonic()
        os.kill(keeper, signal.SIGKILL)
        if cluster.containment == "pidns":
            # The kernel ends the namespace: the tree is gone while leaderd is still frozen.
            gone = max(wait_dead(pid, timeout=5) for pid in (job, *pids)) - killed
            print(f"pidns: keeper SIGKILLed under a frozen daemon: tree gone in {gone:.3f}s")
        else:
            wait_dead(job, timeout=5)  # the command itself dies with its keeper (PDEATHSIG)
            time.sleep(0.5)
            assert all(alive(pid) for pid in pids), "without a PID namespace, leaderd acts"
    finally:
        os.kill(a.pid, signal.SIGCONT)
    assert a.wait(15) == 1
    # Woken, leaderd ends what is left before it releases the lease (its log, in that
    # order) and exits: nothing of the tree outlives it.
    assert not [pid for pid in (job, *pids) if alive(pid)]
    log = a.log()
    assert "internal failure" in log
    assert 0 <= log.find("the child's whole tree is gone") < log.find("released election"), log


def test_term_change_under_a_running_job_stops_it(cluster: Cluster) -> None:
    cluster.start("a")
    first = cluster.next_start()
    # The lease lapses on the backend only: the next renewal wins it again with a new term,
    # while this node never stopped leading. The job's LEADERD_TERM is stale from then on.
    with contextlib.closing(sqlite3.connect(cluster.db, isolation_level=None)) as db:
        db.execute("UPDATE leaderd_lease SET expires_boottime = 0")
    second = cluster.next_start(after=first.term)
    assert second.node == "a"
    (stop,) = events(cluster.workdir, "stop")
    assert stop.pid == first.pid and stop.at < second.at
    assert f"stopping child pid {first.pid}: the term changed" in cluster.daemon("a").log()
    assert not alive(first.pid)
    check_one_job_at_a_time(cluster.workdir)


def test_everything_a_test_started_is_found_by_tree(cluster: Cluster) -> None:
    """The helper the tests above rely on: tree() sees workers that left the session."""
    job, pids = cluster.start_job("a", "--setsid-worker", "--fork-worker")
    found = tree(cluster.daemon("a").pid)
    assert {job, *pids} <= set(found)


def test_keeper_killed_before_the_command_runs_is_an_internal_failure(cluster: Cluster) -> None:
    """Not a command that cannot start (exit 2, bad configuration): its keeper died."""
    for round_ in range(3):
        a = cluster.start(f"a{round_}", backend="static://")
        keeper = wait_for(lambda pid=a.pid: fresh_keeper(pid), 15, interval=0.001, what="a keeper")
        os.kill(keeper, signal.SIGKILL)
        assert a.wait(15) == 1, a.log()
        log = a.log()
        assert "internal failure" in log and "cannot start" not in log, log


def fresh_keeper(daemon: int) -> int | None:
    """The daemon's keeper, caught while it is still starting (its startup probe aside)."""
    for pid in children(daemon):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"--lifeline" in f.read():
                return pid
    return None


def test_keeper_frozen_while_it_starts_is_ended_on_a_step_down(cluster: Cluster) -> None:
    """Before the keeper has said the command runs, leaderd must still watch the lease: a
    frozen keeper may have started the command already, and its switch is frozen too."""
    a = cluster.start("a", "--setsid-worker")
    keeper = wait_for(lambda: fresh_keeper(a.pid), 15, interval=0.001, what="a keeper")
    os.kill(keeper, signal.SIGSTOP)
    try:
        wait_for(lambda: a.is_leader(), 15, what="a to lead")
        resigned = time.monotonic()
        assert a.post("/resign")[0] == 200
        wait_for(lambda: "released election default" in a.log(), 10, what="the release")
        took = time.monotonic() - resigned
        assert not alive(keeper), "leaderd ended the frozen keeper itself"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(keeper, signal.SIGCONT)
    print(f"keeper frozen while starting: released {took:.2f}s after the resign")
    assert took < LEASE_WINDOW, "the step-down waited for the keeper's word"
    assert a.alive()
