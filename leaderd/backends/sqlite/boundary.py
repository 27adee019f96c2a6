"""One request on the SQLite connection: run whole in the connection's thread, with no
transaction left open, and every database error translated at this one boundary."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any, TypeVar

from ..base import BackendError, BackendFatal, BackendUnavailable

# Primary result codes that may clear by themselves; any other database error is fatal.
TRANSIENT_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR}
TRANSIENT_CODES |= {sqlite3.SQLITE_FULL, sqlite3.SQLITE_PROTOCOL, sqlite3.SQLITE_INTERRUPT}

T = TypeVar("T")
# One request: a function of the sqlite3 connection, run whole in the connection's thread.
Run = Callable[..., Awaitable[Any]]


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


def translate(exc: BaseException, path: str) -> BackendError:
    code = getattr(exc, "sqlite_errorcode", None)
    name = getattr(exc, "sqlite_errorname", type(exc).__name__)
    message = f"SQLite file {path}: {exc} ({name})"
    if not isinstance(exc, sqlite3.DatabaseError) or (
        isinstance(code, int) and code & 0xFF in TRANSIENT_CODES
    ):
        return BackendUnavailable(message)
    if code is not None and code & 0xFF in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM):
        message += ": check that the file and its directory exist and are writable"
    return BackendFatal(message)
