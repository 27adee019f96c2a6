"""Stop signals that arrive while the daemon is still starting (imports, configuration):
kept, and acted on once the event loop's own handlers are installed, so that an early
SIGTERM or SIGINT still ends in an orderly exit 0 (rule 7, docs/algorithm.md), not in death
by signal, a KeyboardInterrupt inside an import, or a crash in an extension's initialisation.

leaderd's first line (``leaderd/__init__.py``) blocks them when this process is the
leaderd program: the kernel keeps them pending, whatever is being imported. The command
then either holds them for the daemon (``hold``) or lets them act as usual (``release``).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_pending: list[int] = []
# The interpreter options that take a value in the next argument.
_OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def block_at_launch() -> None:
    """Block the stop signals if this process runs leaderd itself (the console script
    or ``python -m leaderd``); a program that merely imports leaderd is left alone."""
    if launched_as_leaderd(sys.orig_argv):
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def launched_as_leaderd(argv: Sequence[str]) -> bool:
    """Whether the interpreter's own command line runs leaderd."""
    words = iter(argv[1:])
    for word in words:
        if word == "-m":
            return next(words, "") in ("leaderd", "leaderd.__main__")
        if word.startswith("-m"):
            return word[2:] in ("leaderd", "leaderd.__main__")
        if word in _OPTIONS_WITH_VALUE:
            next(words, "")
        elif word == "-c" or word == "-":
            return False
        elif not word.startswith("-"):
            return os.path.basename(word) == "leaderd"  # the script
    return False


def hold() -> None:
    """From now until the loop takes over: remember stop signals instead of dying."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _keep)
    release()  # those blocked since the first line are kept now


def release() -> None:
    """Let the stop signals through (blocked at launch, or by the launcher)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def pending() -> list[int]:
    """The stop signals held so far, oldest first."""
    return list(_pending)


def _keep(signum: int, frame: FrameType | None) -> None:
    _pending.append(signum)
