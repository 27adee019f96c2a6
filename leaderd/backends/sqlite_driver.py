"""The SQLite driver's boundary: one request run whole in the connection's thread, and every
driver error translated into the backend's own (tooz's habit: one translation scope)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

from .base import BackendError, BackendFatal, BackendUnavailable

T = TypeVar("T")
# A lease row as sqlite_schema.SELECT reads it.
Row = tuple[str | None, str, str, int, str | None, str, float, int, str | None, float, str | None]
# Primary result codes that may clear by themselves; any other database error is fatal.
_TRANSIENT_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR}
_TRANSIENT_CODES |= {sqlite3.SQLITE_FULL, sqlite3.SQLITE_PROTOCOL, sqlite3.SQLITE_INTERRUPT}


def whole(db: sqlite3.Connection, busy_ms: int, fn: Callable[..., T], *args: Any) -> T:
    """In the connection's thread: run ``fn(db, *args)``; whatever happens, no transaction
    stays open to hold the file's write lock."""
    db.execute(f"PRAGMA busy_timeout = {busy_ms}")
    try:
        return fn(db, *args)
    finally:
        if db.in_transaction:
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")


def fetch(db: sqlite3.Connection, sql: str, election: str) -> Row | None:
    row: Any = db.execute(sql, (election,)).fetchone()
    return None if row is None else tuple(row)


def translate(exc: BaseException, path: str) -> BackendError:
    code = getattr(exc, "sqlite_errorcode", None)
    name = getattr(exc, "sqlite_errorname", type(exc).__name__)
    message = f"SQLite file {path}: {exc} ({name})"
    if not isinstance(exc, sqlite3.DatabaseError) or (
        isinstance(code, int) and code & 0xFF in _TRANSIENT_CODES
    ):
        return BackendUnavailable(message)
    if code is not None and code & 0xFF in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM):
        message += ": check that the file and its directory exist and are writable"
    return BackendFatal(message)


def number(options: dict[str, str], key: str, default: float, low: float, high: float) -> float:
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
