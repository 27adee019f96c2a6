"""The last guard of a command's tree holds the lease deadline by itself (docs/run.md,
"Who ends the tree when something fails").

leaderd and its keeper frozen together (one SIGSTOP each, as a debugger or a cgroup freezer
applied to both does) must not let the command outlive the lease: its guard (the init of its
PID namespace; without one, its subreaper parent) ends the whole tree before the deadline,
and a standby's job starts only after. The jobs' flock is the kernel's proof: a job that
starts beside a live one writes "busy". Run once per containment.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal

import pytest

from tests.support.daemons import frozen_outside_a_write, wait_for
from tests.support.supervision.cluster import Cluster
from tests.support.supervision.records import (
    alive,
    check_one_job_at_a_time,
    children,
    events,
    keeper_of,
)

pytestmark = pytest.mark.slow


def successor(workdir: str, term: int) -> str | None:
    """What shows that a standby's job came: its start (term above ``term``), or "busy"."""
    for event in events(workdir):
        if event.what == "busy" or (event.what == "start" and event.term > term):
            return event.what
    return None


def test_daemon_and_keeper_frozen_together_cannot_keep_the_job(contained: Cluster) -> None:
    cluster = contained
    job, workers = cluster.start_job("a", "--setsid-worker", "--fork-worker")
    (first,) = events(cluster.workdir, "start")
    a = cluster.daemon("a")
    b = cluster.start("b")
    b.wait_ready()
    frozen = [a.pid, keeper_of(a.pid)]
    frozen_outside_a_write(a)  # inside one, it would hold b's takeover off until SIGCONT
    os.kill(frozen[1], signal.SIGSTOP)
    try:
        came = wait_for(lambda: successor(cluster.workdir, first.term), 60, what="b's job")
        left = [pid for pid in (job, *workers) if alive(pid)]
    finally:
        for pid in reversed(frozen):  # the keeper first: it reads the guard's word first
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    starts = check_one_job_at_a_time(cluster.workdir)  # no "busy": never two jobs at once
    assert came == "start" and not left, left
    assert [s.node for s in starts] == ["a", "b"]
    # Resumed, leaderd finds the deadline passed and stands by: no internal failure.
    wait_for(lambda: re.search(rf"child pid {job} (exited|was killed)", a.log()), 10)
    assert a.alive() and "internal failure" not in a.log()


def test_a_frozen_guard_cannot_keep_the_job_past_a_step_down(contained: Cluster) -> None:
    cluster = contained
    job, workers = cluster.start_job("a", "--setsid-worker")
    a = cluster.daemon("a")
    (guard,) = children(keeper_of(a.pid))
    os.kill(guard, signal.SIGSTOP)
    try:
        assert a.post("/resign")[0] == 200
        wait_for(lambda: "released election default" in a.log(), 15, what="the release")
        left = [pid for pid in (job, *workers) if alive(pid)]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(guard, signal.SIGCONT)
    assert not left, "released while the tree of a frozen guard still ran"
    assert a.alive() and "internal failure" not in a.log()
    check_one_job_at_a_time(cluster.workdir)
