"""The clocks leaderd reads: the only module that reads one (tests/repository/test_clock_rule.py).

Every time that feeds a leadership decision (deadlines, lease, spare and member ages,
back-offs that gate a claim) is judged on CLOCK_BOOTTIME: like CLOCK_MONOTONIC it never
steps, and unlike it, it keeps counting while the host is suspended, so a resumed leader
sees its lease gone, and a spare lease or a member that etcd has meanwhile expired looks
as old as it is (docs/algorithm.md, "One clock for leadership"). Timeouts of a request,
durations and pacing read it too: one clock, so no age is ever taken on the wrong one.
The wall clock is for stamps and display only. What no guest clock can see (a hypervisor
pausing the VM without telling the guest kernel) is in docs/algorithm.md, "Assumptions".
The engine reads them through ``Clock``, a seam so its unit tests can use a fake one.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Protocol


def boottime() -> float:
    """Seconds on CLOCK_BOOTTIME: the one local clock every deadline in leaderd is on."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def suspended_for() -> float:
    """How far CLOCK_BOOTTIME is ahead of CLOCK_MONOTONIC (the time the host spent
    suspended): only to carry a schema-1 SQLite file's CLOCK_MONOTONIC expiries over."""
    return boottime() - time.monotonic()


def wall_time() -> float:
    """Seconds since the epoch on the wall clock, which may step: stamps (a member's
    heartbeat, a record's times) and the first term's floor, never an age or a deadline."""
    return time.time()


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a clock that never steps and counts suspend: deadlines are judged on it."""

    def wall(self) -> dt.datetime:
        """The wall time, only for display (changed_at): never for a decision."""


class SystemClock:
    def now(self) -> float:
        # boottime(), inlined: every /leader answer reads it. Looked up at each call, like
        # boottime's, so a test that stands in for time.clock_gettime stands in here too.
        return time.clock_gettime(time.CLOCK_BOOTTIME)

    def wall(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)
