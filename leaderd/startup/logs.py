"""Log set-up: one line per decision, as text (default) or JSON objects, on stderr; under
systemd, native journal entries whose fields are the decision's (where systemd-python is
installed), so that `journalctl -u leaderd LEADERD_ELECTION=scheduler` finds them."""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from .. import jsonio

# Structured fields the engine and daemon attach with ``extra=`` (event, election, term,
# holder, reason; pid and status for the supervised child) are the record's attributes
# that a plain LogRecord does not have.
_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys() | {"message", "asctime"}
)
# Python's levels to syslog priorities (crit, err, warning, info; below INFO, debug).
_PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra=`` fields of a record that have a value, in the order they were given."""
    return {
        name: value
        for name, value in record.__dict__.items()
        if name not in _STANDARD and value is not None
    }


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **fields(record),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return jsonio.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s.%(msecs)03dZ %(levelname)-7s %(message)s", "%Y-%m-%dT%H:%M:%S"
        )


class JournalHandler(logging.Handler):
    """Native journal entries: MESSAGE is the sentence, each ``extra=`` field a LEADERD_*
    field (``election`` → ``LEADERD_ELECTION``); journald adds the time and the unit."""

    def __init__(self, send: Callable[..., Any]) -> None:
        super().__init__()
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            self._send(message, **journal_fields(record))
        except Exception:
            self.handleError(record)


def journal_fields(record: logging.LogRecord) -> dict[str, Any]:
    """Every field of one journal entry but MESSAGE."""
    entry: dict[str, Any] = {
        "PRIORITY": str(next((p for lvl, p in _PRIORITIES if record.levelno >= lvl), 7)),
        "SYSLOG_IDENTIFIER": "leaderd",
        "LOGGER": record.name,
        "CODE_FILE": record.pathname,
        "CODE_LINE": record.lineno,
        "CODE_FUNC": record.funcName,
    }
    for name, value in fields(record).items():
        entry["LEADERD_" + re.sub(r"[^A-Z0-9_]", "_", name.upper())] = str(value)
    return entry


def is_journal(stream: TextIO) -> bool:
    """True when systemd connected this stream to the journal (JOURNAL_STREAM names it)."""
    try:
        stat = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return False
    return os.environ.get("JOURNAL_STREAM", "") == f"{stat.st_dev}:{stat.st_ino}"


def journal_send() -> Callable[..., Any] | None:
    """systemd-python's journal.send, or None where it is not installed."""
    try:  # the python3-systemd package, or pip's systemd-python (leaderd[systemd])
        journal = importlib.import_module("systemd.journal")
    except ImportError:
        return None
    send: Callable[..., Any] | None = getattr(journal, "send", None)
    return send


def setup(log_format: str = "text", level: str = "info", stream: TextIO | None = None) -> None:
    """Log to the journal when systemd connected stderr to it and systemd-python is
    installed; else to stderr (journald, kubectl logs and podman logs all read it), in UTC."""
    stream = stream or sys.stderr
    send = journal_send() if is_journal(stream) else None
    handler: logging.Handler
    if send is not None:
        handler = JournalHandler(send)
    else:
        handler = logging.StreamHandler(stream)
        formatter: logging.Formatter = JsonFormatter() if log_format == "json" else TextFormatter()
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log would write a line per /leader probe: far too chatty.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
