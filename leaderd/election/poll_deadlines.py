"""The long polls' timeouts: one timer for all the waiting polls of an election, not one each.

A publish answers every waiting poll at once; with a timer of its own, each of them also
cancelled it on the way out (10,000 cancels in a fan-out, most of a microsecond each). Here
the deadlines sit in a heap under one timer set for the earliest, and a publish drops them
all with the waits it answers. A poll that left early (its client went away) leaves its
entry behind until its deadline, the next publish, or a compaction.
"""

from __future__ import annotations

import asyncio
import heapq

from ..clock import boottime

# The loop's timers may fire this early (millisecond ticks): a poll due within it is due.
_EARLY = 0.001
_COMPACT_FROM = 1024  # entries before the first look for polls that left


class PollDeadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.Future[bool]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._compact_at = _COMPACT_FROM

    def add(self, woken: asyncio.Future[bool], timeout: float) -> None:
        """Resolve ``woken`` with False ``timeout`` seconds from now, unless it is done."""
        if len(self._heap) >= self._compact_at:
            self._compact()
        deadline = boottime() + max(0.0, timeout)
        heapq.heappush(self._heap, (deadline, id(woken), woken))
        if self._heap[0][2] is woken:  # the earliest: the timer moves to it
            self._schedule(deadline)

    def clear(self) -> None:
        """Every waiting poll was answered (a publish): no deadline is left to keep."""
        self._heap.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, deadline - boottime()), self._expire)

    def _expire(self) -> None:
        self._timer = None
        due, heap = boottime() + _EARLY, self._heap
        while heap and heap[0][0] <= due:
            time_up(heapq.heappop(heap)[2])
        if heap:
            self._schedule(heap[0][0])

    def _compact(self) -> None:
        """Drop the entries of polls that are over; look again once the heap doubles."""
        self._heap = [entry for entry in self._heap if not entry[2].done()]
        heapq.heapify(self._heap)
        self._compact_at = max(_COMPACT_FROM, 2 * len(self._heap))


def time_up(woken: asyncio.Future[bool]) -> None:
    if not woken.done():
        woken.set_result(False)
