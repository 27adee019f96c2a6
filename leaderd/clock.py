"""The clocks the engine reads, behind one small seam so unit tests can use a fake one.

Every deadline is judged on CLOCK_BOOTTIME: like CLOCK_MONOTONIC it never steps, and unlike
it, it keeps counting while the host is suspended, so a resumed leader sees its lease gone
(docs/algorithm.md, "Self-fencing"). What no guest clock can see (a hypervisor pausing
the VM without telling the guest kernel) is in docs/algorithm.md, "Assumptions".
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Protocol


def boottime() -> float:
    """Seconds on CLOCK_BOOTTIME: the one local clock every deadline in leaderd is on."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a clock that never steps and counts suspend: deadlines are judged on it."""

    def wall(self) -> dt.datetime:
        """The wall time, only for display (changed_at): never for a decision."""


class SystemClock:
    def now(self) -> float:
        return boottime()

    def wall(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)
