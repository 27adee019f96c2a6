"""sqlite:// — one lease row per election in a SQLite file shared by the daemons of one host.

Acquire and renew are one compare-and-set UPSERT inside ``BEGIN IMMEDIATE``; the file is in
WAL mode with ``synchronous=FULL`` so a granted term survives power loss. Expiry is judged on
this host's ``CLOCK_MONOTONIC`` (``time.monotonic()``, the clock the engine self-fences on) plus
the kernel boot id stored in the row: the monotonic clock never steps, and a row written during
an earlier boot counts as expired. Standbys wake within milliseconds: an inotify event on the
file's directory (or, without inotify, a timer) makes them check ``PRAGMA data_version``.
See docs/sqlite.md.
"""

from __future__ import annotations

import asyncio
import ctypes
import datetime as dt
import os
import re
import sqlite3
import time
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import aiosqlite

from .base import Backend, BackendError, BackendFatal, BackendUnavailable, Candidate, Lease

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
SCHEMA_VERSION = 1
_DEFAULT_TABLE = "leaderd_lease"
_DEFAULT_BUSY_TIMEOUT_MS = 5000
_DEFAULT_POLL_INTERVAL_MS = 3.0
_IN_MODIFY = 0x2  # from <sys/inotify.h>
# Without an inotify event, look anyway this often (a missed event only costs latency).
_IDLE_POLL_INTERVAL = 0.5
# After a write, poll fast this long: the commit becomes visible once its fsync completes.
_SETTLE_TIME = 1.0
_SETTLE_POLL_INTERVAL = 0.001
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# Primary result codes that may clear by themselves; any other database error is fatal.
_TRANSIENT_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR}
_TRANSIENT_CODES |= {sqlite3.SQLITE_FULL, sqlite3.SQLITE_PROTOCOL, sqlite3.SQLITE_INTERRUPT}

_CREATE = """
CREATE TABLE IF NOT EXISTS {table} (
    election     TEXT PRIMARY KEY,
    holder       TEXT,
    address      TEXT NOT NULL DEFAULT '',
    term         INTEGER NOT NULL DEFAULT 0,
    acquired_at  TEXT,
    renewed_at   TEXT,
    expires_at   TEXT,
    boot_id      TEXT NOT NULL DEFAULT '',
    expires_mono REAL NOT NULL DEFAULT 0
)"""
_SELECT = """
SELECT holder, address, term, acquired_at, boot_id, expires_mono FROM {table} WHERE election = ?"""
# live: the stored lease has not lapsed on this boot's monotonic clock.
_LIVE = "(holder IS NOT NULL AND boot_id = :boot_id AND expires_mono > :now)"
_MINE = f"(holder = :holder AND {_LIVE})"
_CAS = f"""
INSERT INTO {{table}} (election, holder, address, term, acquired_at, renewed_at, expires_at,
                       boot_id, expires_mono)
VALUES (:election, :holder, :address, 1, :wall, :wall, :expires_at, :boot_id, :expires_mono)
ON CONFLICT (election) DO UPDATE SET
    term = CASE WHEN {_MINE} THEN term ELSE term + 1 END,
    acquired_at = CASE WHEN {_MINE} THEN acquired_at ELSE :wall END,
    holder = :holder, address = :address, renewed_at = :wall, expires_at = :expires_at,
    boot_id = :boot_id, expires_mono = :expires_mono
WHERE {_MINE} OR NOT {_LIVE}"""
_RELEASE = """
UPDATE {table} SET holder = NULL, address = '', expires_at = :wall, expires_mono = :now
WHERE election = :election AND holder = :holder AND term = :term"""

_Row = tuple[str | None, str, int, str | None, str, float]


class SQLiteBackend(Backend):
    """Lease rows in one SQLite file; every daemon on the host opens the same file."""

    kind = "sqlite"

    def __init__(
        self,
        path: str,
        table: str = _DEFAULT_TABLE,
        busy_timeout_ms: int = _DEFAULT_BUSY_TIMEOUT_MS,
        poll_interval_ms: float = _DEFAULT_POLL_INTERVAL_MS,
    ) -> None:
        self.path = path
        self.table = table
        self._busy_timeout = busy_timeout_ms / 1000
        self._poll_interval = poll_interval_ms / 1000
        self._boot_id = ""
        self._elections: list[str] = []
        self._conn: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()  # one statement sequence at a time on the connection
        self._dirty = False  # a transaction was abandoned mid-way: roll back before reuse
        self._closed = False
        self._poll_conn: sqlite3.Connection | None = None
        self._poller: asyncio.Task[None] | None = None
        self._waiters = 0
        self._changed = asyncio.Event()
        self._seen: dict[str, tuple[str | None, int, float | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def from_url(cls, url: str) -> SQLiteBackend:
        parts = urllib.parse.urlsplit(url)
        usage = "expected sqlite:///abs/path.db or sqlite:rel/path.db"
        if parts.scheme.lower() != "sqlite" or parts.netloc or parts.fragment or not parts.path:
            raise BackendFatal(f"bad SQLite URL {url!r}: {usage}")
        path = os.path.abspath(urllib.parse.unquote(parts.path))
        options = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
        unknown = set(options) - {"table", "busy_timeout_ms", "poll_interval_ms"}
        if unknown:
            raise BackendFatal(f"unknown SQLite URL option(s) {sorted(unknown)} in {url!r}")
        table = options.get("table", _DEFAULT_TABLE)
        if not _IDENTIFIER.fullmatch(table):
            raise BackendFatal(f"SQLite table name {table!r} must be a plain identifier")
        busy = _number(options, "busy_timeout_ms", _DEFAULT_BUSY_TIMEOUT_MS, 0, 3_600_000)
        poll = _number(options, "poll_interval_ms", _DEFAULT_POLL_INTERVAL_MS, 0.5, 1000)
        return cls(path, table, int(busy), poll)

    @property
    def description(self) -> str:
        return f"sqlite://{self.path}?table={self.table}"

    async def open(self, elections: Sequence[str]) -> None:
        self._closed = False
        self._elections = list(elections)
        async with self._request("open", self._busy_timeout):
            pass  # connecting prepares the file: WAL, table, rows, write probe

    async def observe(self, election: str) -> Lease:
        lease = await self._read(election, self._busy_timeout)
        self._remember(lease)
        return lease

    async def acquire_or_renew(
        self, election: str, candidate: Candidate, ttl: float, timeout: float, wait: float = 0.0
    ) -> Lease:
        async with self._request("acquire", timeout) as conn:
            self._dirty = True
            await conn.execute("BEGIN IMMEDIATE")
            now = time.monotonic()  # read under the write lock: no one can commit in between
            wall = time.time()
            await conn.execute(
                _CAS.format(table=self.table),
                {
                    "election": election,
                    "holder": candidate.node_id,
                    "address": candidate.address,
                    "wall": _iso(wall),
                    "expires_at": _iso(wall + ttl),
                    "boot_id": self._boot_id,
                    "now": now,
                    "expires_mono": now + ttl,
                },
            )
            row = await _fetch(conn, _SELECT.format(table=self.table), election)
            await conn.execute("COMMIT")
            self._dirty = False
        lease = self._lease(election, row, now)
        self._remember(lease)
        return lease

    async def release(self, election: str, candidate: Candidate, term: int) -> None:
        async with self._request("release", self._busy_timeout) as conn:
            now = time.monotonic()
            params = {"election": election, "holder": candidate.node_id, "term": term}
            await conn.execute(
                _RELEASE.format(table=self.table), {**params, "wall": _iso(time.time()), "now": now}
            )  # a single autocommit UPDATE: its commit bumps data_version, which wakes standbys

    async def wait_for_change(self, election: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        seen = self._seen.get(election)
        if seen is not None and seen[2] is not None:
            deadline = min(deadline, seen[2])  # the lease lapsing is a change as well
        self._waiters += 1
        try:
            while not self._closed:
                changed = self._changed  # taken before the read, so no commit slips between
                self._start_poller()
                lease = await self._read(election, max(deadline - time.monotonic(), 0.001))
                if seen is not None and (lease.holder, lease.term) != seen[:2]:
                    return
                seen = seen or (lease.holder, lease.term, None)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                with suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), remaining)
        except BackendUnavailable:
            return  # a read that ran out of time ends the wait; the engine's next request reports
        finally:
            self._waiters -= 1

    async def close(self) -> None:
        self._closed = True
        self._changed.set()
        self._changed = asyncio.Event()
        if self._poller is not None:
            self._poller.cancel()
            with suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        if self._poll_conn is not None:
            self._poll_conn.close()
            self._poll_conn = None
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(sqlite3.Error, ValueError):
                await conn.close()

    # -- internals --------------------------------------------------------------------------

    @asynccontextmanager
    async def _request(self, what: str, timeout: float) -> AsyncIterator[aiosqlite.Connection]:
        """Run one request on the connection within ``timeout``; translate every error."""
        try:
            async with asyncio.timeout(timeout), self._lock:
                conn = await self._connection()
                await conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
                if self._dirty:  # an earlier request gave up inside its transaction
                    await self._rollback(conn)
                yield conn
        except TimeoutError:
            self._abandon()
            raise BackendUnavailable(
                f"SQLite {what} on {self.path} timed out after {timeout:.3g}s"
            ) from None
        except (sqlite3.Error, ValueError) as exc:
            self._abandon()
            raise _translate(exc, self.path) from exc
        except BaseException:
            self._abandon()
            raise

    async def _connection(self) -> aiosqlite.Connection:
        """The open connection, or a new one on a ready file (also after a transient failure)."""
        if self._closed:
            raise BackendUnavailable(f"SQLite backend for {self.path} is closed")
        if self._conn is not None:
            return self._conn
        self._boot_id = await asyncio.to_thread(_preflight, self.path)
        conn = await aiosqlite.connect(self.path, timeout=self._busy_timeout, isolation_level=None)
        try:
            await _prepare(conn, self.table, self._elections)
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        return conn

    async def _read(self, election: str, timeout: float) -> Lease:
        async with self._request("read", timeout) as conn:
            row = await _fetch(conn, _SELECT.format(table=self.table), election)
        return self._lease(election, row, time.monotonic())

    def _lease(self, election: str, row: _Row | None, now: float) -> Lease:
        if row is None:
            return Lease(election, None, "", 0, None, None)
        holder, address, term, acquired_at, boot_id, expires_mono = row
        if holder is None or boot_id != self._boot_id or expires_mono <= now:
            return Lease(election, None, "", term, None, None)
        acquired = dt.datetime.fromisoformat(acquired_at) if acquired_at else None
        return Lease(election, holder, address, term, acquired, expires_mono - now)

    def _remember(self, lease: Lease) -> None:
        expiry = None if lease.expires_in is None else time.monotonic() + lease.expires_in
        self._seen[lease.election] = (lease.holder, lease.term, expiry)

    async def _rollback(self, conn: aiosqlite.Connection) -> None:
        with suppress(sqlite3.OperationalError):  # "no transaction is active": nothing to undo
            await conn.execute("ROLLBACK")
        self._dirty = False

    def _abandon(self) -> None:
        """Roll back soon, so an abandoned transaction does not keep the write lock."""
        if self._dirty and self._conn is not None:
            task = asyncio.get_running_loop().create_task(self._rollback_later())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _rollback_later(self) -> None:
        with suppress(Exception):
            async with self._lock:
                if self._dirty and self._conn is not None:
                    await self._rollback(self._conn)

    def _start_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        """While anyone waits, wake them when another connection commits to the file."""
        if self._poll_conn is None:
            try:
                self._poll_conn = await asyncio.to_thread(
                    sqlite3.connect, self.path, 0, isolation_level=None, check_same_thread=False
                )
            except sqlite3.Error:
                return  # waiters still wake on their timeout, and their reads report the error
        written = asyncio.Event()
        watch = _watch_writes(os.path.dirname(self.path), written)
        try:
            await self._poll_versions(self._poll_conn, written, fast=watch is None)
        finally:
            if watch is not None:
                asyncio.get_running_loop().remove_reader(watch)
                os.close(watch)

    async def _poll_versions(
        self, conn: sqlite3.Connection, written: asyncio.Event, fast: bool
    ) -> None:
        """Poll data_version every few ms: always without inotify, else for a while after a
        write in the directory (a commit shows only after its fsync, so keep looking)."""
        last, fast_until = _data_version(conn), 0.0
        while self._waiters and not self._closed:
            if fast:
                await asyncio.sleep(self._poll_interval)
            elif time.monotonic() < fast_until:
                await asyncio.sleep(_SETTLE_POLL_INTERVAL)
            else:
                with suppress(TimeoutError):
                    await asyncio.wait_for(written.wait(), _IDLE_POLL_INTERVAL)
            if written.is_set():
                written.clear()
                fast_until = time.monotonic() + _SETTLE_TIME
            # A few microseconds on the loop thread: reads the WAL index in shared memory,
            # no disk I/O while nothing changed (an aiosqlite hop would cost ~50x more CPU).
            version = _data_version(conn)
            if version is not None and version != last:
                last, fast_until = version, 0.0
                self._changed.set()
                self._changed = asyncio.Event()


def _watch_writes(directory: str, written: asyncio.Event) -> int | None:
    """An inotify descriptor that sets ``written`` on any write in ``directory`` (every
    commit appends to the -wal file); None where inotify is unavailable (then: poll)."""
    libc = ctypes.CDLL(None, use_errno=True)
    init = getattr(libc, "inotify_init1", None)
    fd = -1 if init is None else int(init(os.O_NONBLOCK | os.O_CLOEXEC))
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(directory), _IN_MODIFY) < 0:
        os.close(fd)
        return None
    asyncio.get_running_loop().add_reader(fd, _drain, fd, written)
    return fd


def _drain(fd: int, written: asyncio.Event) -> None:
    with suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass
    written.set()


async def _prepare(conn: aiosqlite.Connection, table: str, elections: Sequence[str]) -> None:
    """WAL, durable commits, the table and rows, and a write probe (catches read-only files)."""
    async with conn.execute("PRAGMA journal_mode = WAL") as cursor:
        mode = await cursor.fetchone()
    if mode is None or str(mode[0]).lower() != "wal":
        raise sqlite3.DatabaseError(f"cannot switch to WAL mode (journal_mode is {mode})")
    await conn.execute("PRAGMA synchronous = FULL")  # a granted term must survive power loss
    async with conn.execute("PRAGMA user_version") as cursor:
        version = await cursor.fetchone()
    if version is not None and int(version[0]) > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(f"schema version {version[0]} is newer than this leaderd")
    await conn.execute("BEGIN IMMEDIATE")
    try:
        await conn.execute(_CREATE.format(table=table))
        for election in elections:  # so an operator sees every election, even one never held
            await conn.execute(f"INSERT OR IGNORE INTO {table} (election) VALUES (?)", (election,))
        await conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")  # always writes
        await conn.execute("COMMIT")
    except BaseException:
        with suppress(sqlite3.Error):
            await conn.execute("ROLLBACK")
        raise


async def _fetch(conn: aiosqlite.Connection, sql: str, election: str) -> _Row | None:
    async with conn.execute(sql, (election,)) as cursor:
        row: Any = await cursor.fetchone()
    return None if row is None else (row[0], row[1], row[2], row[3], row[4], row[5])


def _data_version(conn: sqlite3.Connection) -> int | None:
    try:
        return int(conn.execute("PRAGMA data_version").fetchone()[0])
    except sqlite3.Error:
        return None  # busy for a moment (checkpoint); try again on the next tick


def _translate(exc: BaseException, path: str) -> BackendError:
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


def _preflight(path: str) -> str:
    """Fail clearly before SQLite does; return the kernel boot id."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise BackendFatal(f"SQLite file {path}: directory {directory} does not exist")
    try:
        with open(BOOT_ID_FILE) as f:
            return f.read().strip()
    except OSError as exc:
        raise BackendFatal(f"cannot read the kernel boot id from {BOOT_ID_FILE}: {exc}") from exc


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


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
