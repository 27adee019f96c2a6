"""Stop signals that arrive while the daemon is still starting (imports, configuration):
kept, and acted on once the event loop's own handlers are installed, so that an early
SIGTERM still ends in an orderly exit 0 (rule 7, docs/algorithm.md), not in death by signal."""

from __future__ import annotations

import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_pending: list[int] = []


def hold() -> None:
    """From now until the loop takes over: remember stop signals instead of dying."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _keep)


def pending() -> list[int]:
    """The stop signals held so far, oldest first."""
    return list(_pending)


def _keep(signum: int, frame: FrameType | None) -> None:
    _pending.append(signum)
