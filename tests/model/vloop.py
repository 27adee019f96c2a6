"""Virtual time for the model check: an event loop that jumps to its next timer when idle,
per-node clocks that run at their own rates, and node pauses.

Every coroutine of a node runs in a context where ``NODE`` names it (tasks inherit it), so
the loop can hold a paused node's callbacks back until it resumes, while the model servers,
whose callbacks run in ``SERVER``, go on. Nothing waits for real time: a run of minutes of
virtual time takes as long as its callbacks.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import heapq
import selectors
from collections import deque
from collections.abc import Callable
from typing import Any

NODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("model_node", default=None)
EPOCH = dt.datetime(2026, 11, 26, 3, 0, tzinfo=dt.UTC)


class Stuck(RuntimeError):
    """Nothing is ready and no timer is scheduled: every task waits forever."""


def server_context() -> contextvars.Context:
    """A context that belongs to no node: callbacks run in it are never held back."""
    return contextvars.Context()


class NodeClock:
    """One host's clocks: CLOCK_BOOTTIME at ``rate`` of the virtual time (the engine's
    ``Clock``), CLOCK_MONOTONIC that stands still while the host is suspended, and a wall
    clock ``wall_offset`` seconds off."""

    def __init__(self, loop: VirtualLoop, rate: float, offset: float, wall_offset: float) -> None:
        self._loop = loop
        self.rate = rate
        self.offset = offset
        self.wall_offset = wall_offset
        self.suspended = 0.0  # boottime seconds the monotonic clock missed
        self.suspended_since: float | None = None

    def now(self) -> float:
        return self.offset + self.rate * self._loop.time()

    def virtual(self, at: float) -> float:
        """The virtual time at which this clock reads ``at``."""
        return (at - self.offset) / self.rate

    def monotonic(self) -> float:
        now = self.now()
        frozen = 0.0 if self.suspended_since is None else now - self.suspended_since
        return now - self.suspended - frozen

    def wall(self) -> dt.datetime:
        return EPOCH + dt.timedelta(seconds=self.now() + self.wall_offset)

    def suspend(self) -> None:
        self.suspended_since = self.now()

    def wake(self) -> None:
        if self.suspended_since is not None:
            self.suspended += self.now() - self.suspended_since
            self.suspended_since = None


class _Selector(selectors.DefaultSelector):
    """Polls the loop's own file descriptors without blocking; an idle wait is a jump."""

    def __init__(self, idle: Callable[[float | None], None]) -> None:
        super().__init__()
        self._idle = idle

    def select(self, timeout: float | None = None) -> list[Any]:
        events = super().select(0)
        if not events:
            self._idle(timeout)
        return events


class VirtualLoop(asyncio.SelectorEventLoop):
    """``time()`` is virtual; each idle wait moves it to the next timer at once. ``on_step``
    runs once per loop iteration, after every callback of the last one ran."""

    def __init__(self) -> None:
        super().__init__(selector=_Selector(self._idle))
        self._now = 0.0
        self.steps = 0
        self.on_step: Callable[[], None] = lambda: None
        self.paused: set[str] = set()
        self.rates: dict[str, float] = {}  # a node's timers run at its clock's rate
        self._held: dict[str, list[asyncio.Handle]] = {}

    def time(self) -> float:
        return self._now

    def call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """A node's timer is a delay on its own host's clock: scale it to virtual time. A
        timer in the future is at least two clock resolutions away, so that time moves when
        it fires (one sooner than that is due at once, and a node would wait for the rest
        again and again without time moving)."""
        if when > self._now:
            node = NODE.get() if context is None else context.get(NODE)
            rate = self.rates.get(node) if node is not None else None
            if rate is not None:
                when = self._now + (when - self._now) / rate
            when = max(when, self._now + 2 * self._clock_resolution)  # type: ignore[attr-defined]
        return super().call_at(when, callback, *args, context=context)

    def pause(self, node: str) -> None:
        self.paused.add(node)

    def resume(self, node: str) -> None:
        self.paused.discard(node)
        self._ready.extend(self._held.pop(node, []))  # type: ignore[attr-defined]

    def _idle(self, timeout: float | None) -> None:
        self.steps += 1
        self.on_step()
        if timeout is None:
            raise Stuck("no callback ready and no timer scheduled")
        self._now += timeout
        if self.paused:
            self._hold_paused()

    def _hold_paused(self) -> None:
        """Keep the callbacks of paused nodes, due ones included, until they resume."""
        ready: deque[asyncio.Handle] = self._ready  # type: ignore[attr-defined]
        keep = [h for h in ready if not self._hold(h)]
        ready.clear()
        ready.extend(keep)
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        due = self._now + self._clock_resolution  # type: ignore[attr-defined]
        held = [h for h in scheduled if h.when() < due and self._hold(h)]
        if held:
            for handle in held:
                handle._scheduled = False  # type: ignore[attr-defined]
            scheduled[:] = [h for h in scheduled if h._scheduled]  # type: ignore[attr-defined]
            heapq.heapify(scheduled)

    def _hold(self, handle: asyncio.Handle) -> bool:
        context = handle._context  # type: ignore[attr-defined]
        node = context.get(NODE) if context is not None else None
        if node not in self.paused:
            return False
        self._held.setdefault(node, []).append(handle)
        return True
