"""The engine tests' clocks: one moved by hand, and the system's with the same interface
for the few real-time tests."""

from __future__ import annotations

import asyncio
import datetime as dt

from leaderd.clock import boottime

EPOCH = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)


class FakeClock:
    """now() moves only when a test calls advance(); wall() is EPOCH plus it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self.t

    def wall(self) -> dt.datetime:
        return EPOCH + dt.timedelta(seconds=self.t)

    def advance(self, seconds: float) -> None:
        self.t += seconds
        due = [f for t, f in self._sleepers if t <= self.t]
        self._sleepers = [(t, f) for t, f in self._sleepers if t > self.t]
        for future in due:
            if not future.done():
                future.set_result(None)

    async def sleep_until(self, when: float) -> None:
        if when <= self.t:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((when, future))
        await future


class RealClock:
    """The system clock with the same sleep_until, for the short real-time run() tests;
    jump() plays a process pause (every reader of this clock sees the time leap)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return boottime() + self.offset

    def wall(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self.offset)

    def jump(self, seconds: float) -> None:
        self.offset += seconds

    async def sleep_until(self, when: float) -> None:
        await asyncio.sleep(max(0.0, when - self.now()))


Clock = FakeClock | RealClock
