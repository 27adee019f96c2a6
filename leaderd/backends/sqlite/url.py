"""The sqlite:// URL: the file's path and the options it may carry."""

from __future__ import annotations

import os
import re
import urllib.parse

from ..base import BackendFatal

DEFAULT_TABLE = "leaderd_lease"
DEFAULT_BUSY_TIMEOUT_MS = 5000
DEFAULT_POLL_INTERVAL_MS = 3.0
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def parse_url(url: str) -> tuple[str, str, int, float, str]:
    """The file's absolute path, the table, the busy timeout (ms), the poll interval (ms) and
    the crash failover (``proof``: on the holder lock, docs/sqlite.md; ``ttl``: the ttl rule
    only)."""
    parts = urllib.parse.urlsplit(url)
    usage = "expected sqlite:///abs/path.db or sqlite:rel/path.db"
    if parts.scheme.lower() != "sqlite" or parts.netloc or parts.fragment or not parts.path:
        raise BackendFatal(f"bad SQLite URL {url!r}: {usage}")
    path = os.path.abspath(urllib.parse.unquote(parts.path))
    options = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    unknown = set(options) - {"table", "busy_timeout_ms", "poll_interval_ms", "crash_failover"}
    if unknown:
        raise BackendFatal(f"unknown SQLite URL option(s) {sorted(unknown)} in {url!r}")
    table = options.get("table", DEFAULT_TABLE)
    if not _IDENTIFIER.fullmatch(table):
        raise BackendFatal(f"SQLite table name {table!r} must be a plain identifier")
    busy = _number(options, "busy_timeout_ms", DEFAULT_BUSY_TIMEOUT_MS, 0, 3_600_000)
    poll = _number(options, "poll_interval_ms", DEFAULT_POLL_INTERVAL_MS, 0.5, 1000)
    crash_failover = options.get("crash_failover", "proof")
    if crash_failover not in ("proof", "ttl"):
        raise BackendFatal(f"SQLite URL option crash_failover must be proof or ttl in {url!r}")
    return path, table, int(busy), poll, crash_failover


def _number(options: dict[str, str], key: str, default: float, low: float, high: float) -> float:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        raise BackendFatal(f"SQLite URL option {key}={raw!r} must be a number in [{low}, {high}]")
    return value
