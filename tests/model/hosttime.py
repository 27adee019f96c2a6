"""The clocks that code reads through the ``time`` module, as the running node's host has
them, for as long as a run lasts: CLOCK_BOOTTIME (leaderd.clock.boottime), CLOCK_MONOTONIC
(which stands still while the host is suspended) and the wall clock. Code that no node runs
reads the real clocks. The patch is on the ``time`` module itself, so it reaches every
reader however it names the clock, today's and those of fixes to come.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from unittest import mock

from .vloop import NODE, NodeClock

_MONOTONIC = (time.CLOCK_MONOTONIC, time.CLOCK_MONOTONIC_RAW)


@contextlib.contextmanager
def host_time(clock_of: Callable[[str], NodeClock]) -> Iterator[None]:
    real_monotonic, real_gettime, real_time = time.monotonic, time.clock_gettime, time.time

    def clock() -> NodeClock | None:
        node = NODE.get()
        return None if node is None else clock_of(node)

    def monotonic() -> float:
        host = clock()
        return real_monotonic() if host is None else host.monotonic()

    def wall() -> float:
        host = clock()
        return real_time() if host is None else host.wall().timestamp()

    def clock_gettime(which: int) -> float:
        host = clock()
        if host is None:
            return real_gettime(which)
        if which == time.CLOCK_BOOTTIME:
            return host.now()
        if which in _MONOTONIC:
            return host.monotonic()
        return host.wall().timestamp() if which == time.CLOCK_REALTIME else real_gettime(which)

    with (
        mock.patch.object(time, "monotonic", monotonic),
        mock.patch.object(time, "clock_gettime", clock_gettime),
        mock.patch.object(time, "time", wall),
    ):
        yield
