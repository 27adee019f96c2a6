"""`leaderd run -- COMMAND` with real daemons, real jobs and real signals.

Every job (job.py) records its life in a shared file and holds a flock while alive, so
"two jobs at once" is caught by the kernel, not inferred from timestamps.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import sqlite3
import sys
import time

import pytest

from tests.support.daemons import frozen_outside_a_write, wait_for
from tests.support.supervision.cluster import Cluster, wait_dead
from tests.support.supervision.records import (
    GRACE,
    LEASE_WINDOW,
    TTL,
    alive,
    check_one_job_at_a_time,
    events,
    tree,
)

pytestmark = pytest.mark.slow


def grandchildren(cluster: Cluster) -> list[int]:
    tagged = [e.what for e in events(cluster.workdir) if e.what.startswith("grandchild-")]
    return [int(what.rpartition("-")[2]) for what in tagged]


def test_three_daemons_hand_the_job_over_one_at_a_time(cluster: Cluster) -> None:
    for node in "abc":
        cluster.start(node)
    first = cluster.next_start()
    # A graceful stop: the job is told (SIGTERM), then the lease is released.
    assert cluster.daemon(first.node).stop() == 0
    assert [e.pid for e in events(cluster.workdir, "stop")] == [first.pid]
    second = cluster.next_start(after=first.term)
    assert second.node != first.node
    # A crash: nothing of the old leader may survive it.
    crashed = time.monotonic()
    cluster.daemon(second.node).kill()
    dead_at = wait_dead(second.pid, timeout=5)
    third = cluster.next_start(after=second.term)
    took_over = third.at - crashed
    print(f"leader SIGKILLed: job gone in {dead_at - crashed:.3f}s, "
          f"next job started after {took_over:.2f}s")  # fmt: skip
    # Its keeper ended the tree on the lifeline's EOF (test_keeper.py proves the cause: it
    # reports "orphaned"): the job was gone before the next one started.
    assert dead_at < third.at
    assert third.node not in (first.node, second.node)
    assert took_over < TTL + 3
    check_one_job_at_a_time(cluster.workdir)


def test_frozen_daemon_cannot_keep_its_job_past_the_lease(cluster: Cluster) -> None:
    a = cluster.start("a")
    first = cluster.next_start()
    cluster.start("b")
    frozen_outside_a_write(a)  # the job runs on, unsupervised by leaderd
    frozen = time.monotonic()
    try:
        # The last renewal was sent before the freeze: the deadline is at most this.
        deadline = frozen + LEASE_WINDOW
        died = wait_dead(first.pid, timeout=LEASE_WINDOW + 5)
        second = cluster.next_start(after=first.term)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    (stop,) = events(cluster.workdir, "stop")
    print(f"daemon frozen: job told to stop {deadline - stop.at:.2f}s before the deadline")
    assert stop.pid == first.pid and stop.at < deadline, "SIGTERM must come before the deadline"
    # SIGKILL is due at the deadline, before the lease can lapse: gone before b's job began.
    assert died < second.at
    assert second.node == "b"
    wait_for(lambda: a.is_leader() is False, 10, what="a to follow after SIGCONT")
    check_one_job_at_a_time(cluster.workdir)
    assert [e.node for e in events(cluster.workdir, "start")] == ["a", "b"]


def test_frozen_host_resumes_by_killing_its_job_at_once(cluster: Cluster) -> None:
    a = cluster.start("a")
    first = cluster.next_start()
    cluster.start("b")
    # Freeze the whole leader (a VM pause): the daemon, its keeper and everything under it.
    frozen_tree = tree(a.pid)
    frozen_outside_a_write(a)  # inside one, it would hold b's takeover off until SIGCONT
    for pid in frozen_tree[1:]:
        os.kill(pid, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        # b wins the lease; its job finds the frozen job still holding the flock.
        busy = wait_for(lambda: events(cluster.workdir, "busy"), 30, what="b's job to start")
        assert busy[0].node == "b"
        asleep = len(a.log())  # a frozen daemon writes nothing
        resumed = time.monotonic()
        os.kill(a.pid, signal.SIGCONT)  # the daemon alone: it must kill the job at once
        # Its keeper and guard still frozen: only the daemon can end the job now.
        gone = wait_dead(first.pid, timeout=5) - resumed
        second = cluster.next_start(after=first.term, timeout=5)
    finally:
        for pid in frozen_tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    print(f"frozen leader resumed: its job killed in {gone:.3f}s")
    # At once: its first act on waking, before any backend request of its own (the SQLite
    # driver logs each one, "executing ...").
    wait_for(lambda: "executing " in a.log()[asleep:], 10, what="a's first request awake")
    woken = a.log()[asleep:]
    assert 0 <= woken.find(f"stopping child pid {first.pid}") < woken.find("executing "), woken
    # b's job, which waited on the frozen job's flock, started once that job was dead.
    assert (busy[0].pid, busy[0].term) == (second.pid, second.term)
    assert max(e.at for e in events(cluster.workdir) if e.pid == first.pid) < frozen
    starts = events(cluster.workdir, "start")
    assert not [e for e in starts if e.node == "a" and e.term > first.term]


def test_backend_lost_job_is_stopped_before_the_deadline(cluster: Cluster) -> None:
    a = cluster.start("a")
    first = cluster.next_start()
    # Another process holds the database's write lock: every renewal now fails.
    locker = sqlite3.connect(cluster.db, timeout=10, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    locked = time.monotonic()
    try:
        died = wait_dead(first.pid, timeout=LEASE_WINDOW + 5)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    (stop,) = events(cluster.workdir, "stop")
    deadline = locked + LEASE_WINDOW
    print(f"backend lost: job gone {deadline - died:.2f}s before the latest possible deadline")
    assert stop.at < deadline - GRACE / 2 and died < deadline
    assert f"stopping child pid {first.pid}: lease deadline in" in a.log()
    # The backend is back: a new job (the same term if the lease never lapsed meanwhile).
    wait_for(lambda: len(events(cluster.workdir, "start")) == 2, 15, what="a new job")
    check_one_job_at_a_time(cluster.workdir)


def test_job_ignoring_sigterm_is_killed_with_its_grandchildren(cluster: Cluster) -> None:
    a = cluster.start("a", "--ignore-term", "--grandchildren", backend="static://")
    job = cluster.next_start()
    kids = wait_for(lambda: len(grandchildren(cluster)) == 2 and grandchildren(cluster), 10)
    t0 = time.monotonic()
    assert a.stop() == 0
    took = time.monotonic() - t0
    assert GRACE <= took < GRACE + 3, f"SIGKILL comes after the grace, not {took:.2f}s"
    for pid in (job.pid, *kids):
        assert not alive(pid), f"pid {pid} survived"
    assert f"child pid {job.pid} was killed by SIGKILL" in a.log()
    assert f"stopping child pid {job.pid}: shutting down" in a.log()


def test_signals_are_forwarded_to_the_job(cluster: Cluster) -> None:
    a = cluster.start("a", backend="static://")
    job = cluster.next_start()
    a.signal(signal.SIGHUP)
    wait_for(lambda: events(cluster.workdir, "hup"), 5, what="the job to get SIGHUP")
    assert alive(job.pid) and a.alive()
    assert a.stop() == 0


@pytest.mark.parametrize(
    ("options", "status"),
    [(("--exit-after", "0.3", "7"), 7), (("--exit-after", "0.3", "0"), 0)],
)
def test_job_exit_status_becomes_the_daemons(
    cluster: Cluster, options: tuple[str, ...], status: int
) -> None:
    a = cluster.start("a", *options)
    assert a.wait(15) == status
    assert "released election default" in a.log()
    assert [e.what for e in events(cluster.workdir) if e.what in ("start", "exit")] == [
        "start",
        "exit",
    ]


def test_job_killed_by_a_signal_exits_128_plus_signal(cluster: Cluster) -> None:
    a = cluster.start("a", command=["sh", "-c", "sleep 0.3; kill -USR1 $$"])
    assert a.wait(15) == 128 + signal.SIGUSR1
    assert "was killed by SIGUSR1" in a.log()
    assert "released election default" in a.log()


def test_on_exit_restart_restarts_with_backoff(cluster: Cluster) -> None:
    a = cluster.start("a", "--exit-after", "0.1", "1", extra=("--on-exit", "restart"))
    wait_for(lambda: len(events(cluster.workdir, "start")) >= 3, 15, what="three starts")
    assert a.alive() and a.is_leader()
    starts = events(cluster.workdir, "start")[:3]
    assert len({e.term for e in starts}) == 1, "restarts keep the term: leadership never lapsed"
    # The backoff leaderd announced doubles, and each restart waited at least that long
    # (a busy host may add to a gap, never take from it).
    announced = [float(s) for s in re.findall(r"restarting it in ([0-9.]+)s", a.log())[:2]]
    assert announced == [1.0, 2.0], a.log()
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(starts)]
    assert all(gap >= wait for gap, wait in zip(gaps, announced, strict=True)), gaps
    assert a.stop() == 0


def test_command_that_cannot_start_exits_2(cluster: Cluster) -> None:
    missing = os.path.join(cluster.workdir, "missing")
    a = cluster.start("a", command=[missing])
    assert a.wait(15) == 2
    assert f"cannot start {missing}: {missing}: command not found" in a.log()
    plain = os.path.join(cluster.workdir, "plain")
    with open(plain, "w") as f:
        f.write("#!/bin/sh\n")
    b = cluster.start("b", command=[plain])
    assert b.wait(15) == 2
    assert "not executable" in b.log()


def test_command_failing_at_exec_releases_the_lease_and_exits_2(cluster: Cluster) -> None:
    # Executable, but its interpreter is missing: exec fails only once leading.
    script = os.path.join(cluster.workdir, "script")
    with open(script, "w") as f:
        f.write("#!/nonexistent/interpreter\n")
    os.chmod(script, 0o755)
    a = cluster.start("a", command=[script])
    assert a.wait(15) == 2
    log = a.log()
    assert f"cannot start {script}: No such file or directory" in log
    term = int(re.findall(r"released election default, term (\d+)", log)[0])
    with sqlite3.connect(cluster.db) as db:
        assert db.execute("SELECT holder, term FROM leaderd_lease").fetchall() == [(None, term)]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
