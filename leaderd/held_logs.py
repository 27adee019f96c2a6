"""Log lines that wait for a hand-over's writes: the release, the woken long polls' answers.

A log line written after seconds of idleness costs a quarter of a millisecond, because its
code runs cold. Two of them stood between a SIGTERM and the release's request, and one
between a grant and the new leader's first answer. So while a hand-over is on its way,
lines are kept, each with the time and place it was logged, and written in order with any
line logged meanwhile: once the release has its answer (engine.py), or a loop turn after a
publish (answers.py), and never more than ``_LONGEST_HOLD`` later, so a request that hangs
hides nothing for long.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from typing import Any

from .clock import wall_time

_LONGEST_HOLD = 0.05  # seconds: far past a request's leaving, short for someone reading logs

# What a line needs to be written later: (logger, level, message, args, extra, time logged,
# (file, line, function)) for a kept call, or the record another caller already made.
_Call = tuple[logging.Logger, int, str, tuple[Any, ...], "dict[str, Any] | None", float,
              tuple[str, int, str]]  # fmt: skip
_held: list[_Call | logging.LogRecord] | None = None
_holder = 0  # the thread of the loop that holds: another thread's lines are not kept


def holding() -> bool:
    return _held is not None


def hold() -> None:
    """Keep every line logged from now on until ``release``, ``_LONGEST_HOLD`` at most."""
    global _held, _holder
    if _held is not None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # nothing would release it
    _held, _holder = [], threading.get_ident()
    for handler in logging.getLogger().handlers:
        handler.addFilter(_keep)
    loop.call_later(_LONGEST_HOLD, release)


def release() -> None:
    """Write every kept line, oldest first; then log directly again. Idempotent."""
    global _held
    lines, _held = _held, None
    if lines is None:
        return
    root = logging.getLogger()
    for handler in root.handlers:
        handler.removeFilter(_keep)
    for line in lines:
        if isinstance(line, logging.LogRecord):
            root.handle(line)
        else:
            _emit(*line)


def release_soon() -> None:
    """``release`` after the callbacks scheduled so far: the answers a publish just woke."""
    if _held is not None:  # a hold needs the running loop that this call then uses
        asyncio.get_running_loop().call_soon(release)


def log(
    logger: logging.Logger, level: int, msg: str, *args: Any, extra: dict[str, Any] | None = None
) -> None:
    """``logger.log``; while held, only what the line needs is kept (its record is the cost)."""
    if _held is None:
        logger.log(level, msg, *args, extra=extra, stacklevel=2)
    elif logger.isEnabledFor(level):
        caller = sys._getframe(1)
        where = (caller.f_code.co_filename, caller.f_lineno, caller.f_code.co_name)
        _held.append((logger, level, msg, args, extra, wall_time(), where))


def _keep(record: logging.LogRecord) -> bool:
    """A handler's filter while held: a line someone else logged waits its turn."""
    if _held is None or record.thread != _holder:  # a list another thread could append to late
        return True
    if not any(line is record for line in _held[-1:]):  # one record, several handlers
        _held.append(record)
    return False


def _emit(
    logger: logging.Logger,
    level: int,
    msg: str,
    args: tuple[Any, ...],
    extra: dict[str, Any] | None,
    created: float,
    where: tuple[str, int, str],
) -> None:
    path, line, function = where
    record = logger.makeRecord(logger.name, level, path, line, msg, args, None, function, extra)
    # The time it was logged, not written: merged logs keep the hand-over's order.
    record.relativeCreated -= (record.created - created) * 1000
    record.created, record.msecs = created, (created - int(created)) * 1000
    logger.handle(record)
