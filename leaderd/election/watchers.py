"""Revisions of one election and everyone waiting for the next: long polls, streams, listeners.

The engine decides what the status is; this module numbers its changes and delivers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from .collector_pause import collector
from .poll_deadlines import PollDeadlines, time_up
from .status import ElectionStatus, Role

log = logging.getLogger("leaderd.engine")
_LEADER = Role.LEADER  # read per woken poll: Python 3.11 looks enum members up slowly

ChangeListener = Callable[[ElectionStatus], None]
# How many changes a stream reader may fall behind before it loses the oldest.
STREAM_BACKLOG = 256


class Answer(Protocol):
    """What a long poll answers: a status, or its encoded answer."""

    @property
    def role(self) -> Role: ...

    @property
    def revision(self) -> int: ...


A = TypeVar("A", bound=Answer)


class Watchers:
    def __init__(self, election: str, changed_at: dt.datetime) -> None:
        self.election = election
        # Moves by one on every change of role, leader or term (docs/api.md).
        self.revision = 0
        self.changed_at = changed_at
        # One future per waiting long poll, resolved by the next publish (True) or by its
        # deadline (False): an Event and an asyncio.timeout() cost each of 10,000 woken
        # waiters more than the rest of its answer.
        self._waiting: dict[asyncio.Future[bool], None] = {}
        self._deadlines = PollDeadlines()
        self._listeners: list[ChangeListener] = []
        self._streams: set[asyncio.Queue[ElectionStatus]] = set()
        self._pollers = 0
        self._latest: ElectionStatus | None = None  # the last status published

    @property
    def count(self) -> int:
        return self._pollers + len(self._streams)

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def next_revision(self, when: dt.datetime) -> None:
        self.revision += 1
        self.changed_at = when

    def publish(self, status: ElectionStatus) -> None:
        """Deliver a new revision: wake long polls, queue it on streams, call listeners."""
        self._latest = status
        waiting, self._waiting = self._waiting, {}
        self._deadlines.clear()
        if waiting or self._streams:
            # No collection while thousands of woken waiters write their answers.
            with collector.paused(asyncio.get_running_loop()):
                self._deliver(waiting, status)
        self.announce(status)

    def _deliver(self, waiting: dict[asyncio.Future[bool], None], status: ElectionStatus) -> None:
        for woken in waiting:
            if not woken.done():
                woken.set_result(True)
        for queue in self._streams:
            _offer(queue, status)

    def end_waits(self) -> None:
        """Resolve every long poll's wait as its timer would: it answers the current status."""
        waiting, self._waiting = self._waiting, {}
        self._deadlines.clear()
        for woken in waiting:
            time_up(woken)

    def announce(self, status: ElectionStatus) -> None:
        """Call the listeners with the status, with no new revision (readiness moved)."""
        for listener in self._listeners:
            try:
                listener(status)
            except Exception:  # one broken listener must not stop the election or the others
                log.exception("listener of election %s failed", self.election)

    async def wait(
        self,
        current: Callable[[], A],
        published: Callable[[ElectionStatus], A],
        revision: int | None,
        timeout: float,
    ) -> A:
        """The answer once its revision differs from ``revision`` (the next change when
        None), or the current answer after ``timeout`` seconds. ``current`` derives the
        answer now; ``published`` makes it of the status a publish delivered."""
        answer = current()
        awaited = answer.revision if revision is None else revision
        if answer.revision != awaited:
            return answer
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[bool] = loop.create_future()
        self._waiting[woken] = None
        self._deadlines.add(woken, timeout)
        self._pollers += 1
        try:
            # Every publish is a new revision: one wake-up answers.
            return self._woken(current, published) if await woken else current()
        finally:
            self._waiting.pop(woken, None)
            self._pollers -= 1

    def _woken(self, current: Callable[[], A], published: Callable[[ElectionStatus], A]) -> A:
        """The answer for a waiter woken by a publish. Thousands wake at once: they share
        the published status, unless it says "leader", which is derived anew for each
        answer (the self-fence deadline may pass while they are being answered)."""
        latest = self._latest
        if latest is None or latest.role is _LEADER:
            return current()
        return published(latest)

    @contextlib.contextmanager
    def stream(self, first: ElectionStatus) -> Iterator[asyncio.Queue[ElectionStatus]]:
        """A queue holding ``first``, then one status per change."""
        queue: asyncio.Queue[ElectionStatus] = asyncio.Queue(maxsize=STREAM_BACKLOG)
        queue.put_nowait(first)
        self._streams.add(queue)
        try:
            yield queue
        finally:
            self._streams.discard(queue)


def _offer(queue: asyncio.Queue[ElectionStatus], status: ElectionStatus) -> None:
    if queue.full():
        queue.get_nowait()
    queue.put_nowait(status)
