"""Keep Python's cyclic garbage collector out of a fan-out.

A change wakes every waiting long poll at once, and their answers allocate enough to
trigger collections. With 10,000 long polls open, a full collection walks every
connection's objects: 100-540 ms on a small VM, in which no answer is written. So a
publish that wakes waiters pauses automatic collection until the callbacks queued so far
have run: the woken waiters each write their answer in that one turn of the loop. The
collection that was due then runs at the next allocation after them, when the change has
been delivered. Nothing is lost: a pause only moves a collection, and it lasts one turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator


class CollectorPause:
    """Nested pauses of automatic collection, each until the loop's queued callbacks ran."""

    def __init__(self) -> None:
        self._held = 0
        self._loop: asyncio.AbstractEventLoop | None = None  # where the resumes are queued

    @contextlib.contextmanager
    def paused(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        """No automatic collection in the block, nor in the callbacks it queues."""
        if self._held and self._loop is not None and self._loop.is_closed():
            self._held = 0  # that loop closed before it ran our resumes (tests end loops)
            gc.enable()
        if self._held == 0 and not gc.isenabled():  # the program that runs us disabled it
            yield
            return
        gc.disable()
        self._held += 1
        self._loop = loop
        try:
            yield
        finally:
            loop.call_soon(self._resume)  # after the callbacks the block queued

    def _resume(self) -> None:
        self._held -= 1
        if self._held == 0:
            gc.enable()


collector = CollectorPause()
