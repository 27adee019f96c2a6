"""The clocks the engine reads, behind one small seam so unit tests can use a fake one."""

from __future__ import annotations

import datetime as dt
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never steps: deadlines are judged on it."""

    def wall(self) -> dt.datetime:
        """The wall time, only for display (changed_at): never for a decision."""


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)
