"""Log set-up: one line per decision, as text (default) or JSON objects."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from . import jsonio

# Structured fields the engine and daemon attach with ``extra=``.
FIELDS = ("event", "election", "term", "holder", "reason")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return jsonio.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s.%(msecs)03dZ %(levelname)-7s %(message)s", "%Y-%m-%dT%H:%M:%S"
        )


def setup(log_format: str = "text", level: str = "info") -> None:
    """Log to stderr (journald and kubectl logs both read it), in UTC."""
    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter = JsonFormatter() if log_format == "json" else TextFormatter()
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log would write a line per /leader probe: far too chatty.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
