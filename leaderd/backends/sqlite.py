"""sqlite:// — one lease row per election in a SQLite file shared by the daemons of one host.

Acquire and renew are one compare-and-set UPSERT inside ``BEGIN IMMEDIATE``; the file is in
WAL mode with ``synchronous=FULL`` so a granted term survives power loss. Expiry is judged on
this host's CLOCK_BOOTTIME (the clock the engine self-fences on: it never steps and counts
suspend) plus the kernel boot id stored in the row. A row written under another boot id is
never live, but never free either: like any unreleased lease it is taken over only when the
engine names the version it watched for one ttl. sqlite_host.py holds the guards that keep
the file to one host; sqlite_wake.py how standbys hear a commit. See docs/sqlite.md.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import re
import sqlite3
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from typing import Any, TypeVar

import aiosqlite

from ..clock import boottime, wall_time
from . import sqlite_grant
from . import sqlite_records as records
from .base import (
    Backend,
    BackendError,
    BackendFatal,
    BackendUnavailable,
    Candidate,
    Grant,
    Lease,
    heard_in,
)
from .records import EndReason, Member, Tenure
from .sqlite_host import (
    DirectoryLock,
    FileIdentity,
    ForeignWriters,
    boot_id,
    persist_wal,
    refuse_shared_filesystem,
)
from .sqlite_records import iso
from .sqlite_schema import CAS, RELEASE, SELECT, prepare
from .sqlite_wake import CommitWatcher

log = logging.getLogger(__name__)

_DEFAULT_TABLE = "leaderd_lease"
_DEFAULT_BUSY_TIMEOUT_MS = 5000
_DEFAULT_POLL_INTERVAL_MS = 3.0
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# Primary result codes that may clear by themselves; any other database error is fatal.
_TRANSIENT_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR}
_TRANSIENT_CODES |= {sqlite3.SQLITE_FULL, sqlite3.SQLITE_PROTOCOL, sqlite3.SQLITE_INTERRUPT}

_Row = tuple[str | None, str, str, int, str | None, str, float, int, str | None, float]
T = TypeVar("T")
# One request: a function of the sqlite3 connection, run whole in the connection's thread.
Run = Callable[..., Awaitable[Any]]


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
        self._boot_id = ""
        self._elections: list[str] = []
        self._conn: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()  # one request at a time on the connection
        self._closed = False
        self._directory = DirectoryLock(os.path.dirname(path))
        self._identity: FileIdentity | None = None
        self._foreign = ForeignWriters(path)
        self._commits = CommitWatcher(path, poll_interval_ms / 1000)
        # Per election: (holder, instance, term) as last read, and when that lease lapses on
        # CLOCK_BOOTTIME; a renewal is no change a waiter must hear of.
        self._seen: dict[str, tuple[tuple[str | None, str, int], float | None]] = {}
        self._me: dict[str, Candidate] = {}  # per election: who asks here (told of a grant)

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

    @property
    def grants(self) -> bool:
        return True

    async def open(self, elections: Sequence[str]) -> None:
        self._closed = False
        self._elections = list(elections)
        async with self._request("open", self._busy_timeout):
            pass  # connecting prepares the file: WAL, table, rows, write probe

    async def observe(
        self, election: str, candidate: Candidate | None = None, ttl: float = 0.0
    ) -> Lease:
        if candidate is None:
            return await self._read(election, self._busy_timeout, members=True)
        self._me[election] = candidate
        async with self._request("read", self._busy_timeout) as run:
            row, now, members = await run(self._heard, election, candidate, ttl)
            return heard_in(self._lease(election, row, now, members), candidate)

    def _heard(
        self, db: sqlite3.Connection, election: str, me: Candidate, ttl: float
    ) -> tuple[_Row | None, float, tuple[Member, ...]]:
        """A cooling-down candidate's read, with its heartbeat: one transaction, one hop."""
        db.execute("BEGIN IMMEDIATE")
        now = boottime()
        records.heard(db, self.table, election, me, self._clock(now, ttl), campaigning=False)
        row = _fetch(db, self._select, election)
        members = records.members(db, self.table, election, self._boot_id, now)
        db.execute("COMMIT")
        return row, now, members

    async def acquire_or_renew(
        self,
        election: str,
        candidate: Candidate,
        ttl: float,
        timeout: float,
        wait: float = 0.0,
        *,
        takeover: str = "",
        min_term: int = 0,
        lost_term: int = 0,
    ) -> Lease:
        ask = {
            "election": election,
            "holder": candidate.node_id,
            "instance": candidate.instance,
            "address": candidate.address,
            "ttl": ttl,
            "min_term": min_term,
            "takeover": int(takeover) if takeover.isdigit() else -1,
            "lost_term": lost_term,
        }
        self._me[election] = candidate
        async with self._request("acquire", timeout) as run:
            row, now, members = await run(self._claim, ask, candidate)
            return heard_in(self._lease(election, row, now, members), candidate)

    def _claim(
        self, db: sqlite3.Connection, ask: dict[str, Any], me: Candidate
    ) -> tuple[_Row | None, float, tuple[Member, ...]]:
        """The compare-and-set, the member's heartbeat and the history record, in the
        connection's thread: one transaction, one hop."""
        election = ask["election"]
        db.execute("BEGIN IMMEDIATE")
        now = boottime()  # read under the write lock: no one can commit in between
        before = _fetch(db, self._select, election)
        self._check_foreign(election, before)
        wall = wall_time()
        db.execute(
            CAS.format(table=self.table),
            {
                **ask,
                "wall": iso(wall),
                "expires_at": iso(wall + ask["ttl"]),
                "boot_id": self._boot_id,
                "now": now,
                "expires": now + ask["ttl"],
            },
        )
        row = _fetch(db, self._select, election)
        records.heard(db, self.table, election, me, self._clock(now, ask["ttl"]), campaigning=True)
        records.began(db, self.table, election, me, (before, row), (wall, now, self._boot_id))
        if ask["lost_term"]:
            records.lost(db, self.table, election, me, ask["lost_term"])
        members = records.members(db, self.table, election, self._boot_id, now)
        db.execute("COMMIT")
        return row, now, members

    async def release(
        self,
        election: str,
        candidate: Candidate,
        term: int,
        reason: EndReason = EndReason.RELEASED,
        *,
        reserve_for: str = "",
        ttl: float = 0.0,
        grant: bool = False,
        version: str = "",
    ) -> None:
        async with self._request("release", self._busy_timeout) as run:
            params = {
                "election": election,
                "holder": candidate.node_id,
                "instance": candidate.instance,
                "term": term,
                "reserve_for": reserve_for,
                "reserve_ttl": ttl if reserve_for else 0.0,
                "boot_id": self._boot_id,
                "version": version,
            }
            # One transaction: its commit bumps data_version, which wakes standbys.
            await run(self._release, params, reason, grant and not reserve_for)

    def _release(
        self, db: sqlite3.Connection, params: dict[str, Any], reason: EndReason, grant: bool
    ) -> None:
        db.execute("BEGIN IMMEDIATE")
        wall = wall_time()  # read under the write lock, as the member ages it compares
        params = {**params, "wall": iso(wall), "wall_seconds": wall, "now": boottime()}
        granted = grant and sqlite_grant.grant(db, self.table, params)
        if granted or db.execute(RELEASE.format(table=self.table), params).rowcount > 0:
            records.released(db, self.table, params, reason)
        records.withdrawn(db, self.table, params)
        db.execute("COMMIT")

    async def history(self, election: str, limit: int) -> list[Tenure]:
        async with self._request("history", self._busy_timeout) as run:
            tenures: list[Tenure] = await run(records.history, self.table, election, limit)
            return tenures

    async def wait_for_change(self, election: str, timeout: float) -> Grant | None:
        deadline = boottime() + timeout
        seen = self._seen.get(election)
        if seen is not None and seen[1] is not None:
            deadline = min(deadline, seen[1])  # the lease lapsing is a change as well
        self._commits.waiters += 1
        try:
            while not self._closed:
                changed = self._commits.changed  # taken before the read: no commit slips by
                await self._commits.arm()
                lease, granted = await self._look_for_grant(election, deadline)
                if seen is not None and _holding(lease) != seen[0]:
                    return granted
                seen = seen or (_holding(lease), None)
                remaining = deadline - boottime()
                if remaining <= 0:
                    return None
                with suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), remaining)
        except BackendError:
            return None  # a failed read ends the wait; the engine's next request reports it
        finally:
            self._commits.waiters -= 1
        return None

    async def _look_for_grant(self, election: str, deadline: float) -> tuple[Lease, Grant | None]:
        """A waiter's read: the lease, and the Grant when a release handed it to us."""
        me = self._me.get(election)
        async with self._request("read", max(deadline - boottime(), 0.001)) as run:
            row, now, heard = await run(self._look_granted, election, me)
        lease = self._lease(election, row, now)
        if heard is None or not lease.expires_in:
            return lease, None  # not a live grant naming a heartbeat of ours: a round tells
        return lease, Grant(replace(lease, expires_in=heard.lasts), heard.heard_at)

    def _look_granted(
        self, db: sqlite3.Connection, election: str, me: Candidate | None
    ) -> tuple[_Row | None, float, sqlite_grant.Heartbeat | None]:
        db.execute("BEGIN")  # one snapshot: the lease row and the heartbeat it names
        row, now, _ = self._look(db, election, False)
        heard = None if me is None else sqlite_grant.heartbeat(db, self.table, election, me)
        db.execute("COMMIT")
        return row, now, heard

    async def close(self) -> None:
        self._closed = True
        await self._commits.close()
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(sqlite3.Error, ValueError):
                await conn.close()
        self._directory.release()

    # -- internals --------------------------------------------------------------------------

    @property
    def _select(self) -> str:
        return SELECT.format(table=self.table)

    @asynccontextmanager
    async def _request(self, what: str, timeout: float) -> AsyncIterator[Run]:
        """One request within ``timeout``, every error translated. It yields ``run(fn,
        *args)``: ``fn(db, *args)`` runs whole in the connection's thread (one hop, not one
        per statement), and never leaves a transaction open, even once given up on."""
        try:
            async with asyncio.timeout(timeout), self._lock:
                conn = await self._connection()
                if self._identity is not None:
                    self._identity.check()  # a deleted or replaced file is a lost lease
                busy_ms = int(timeout * 1000)

                async def run(fn: Callable[..., T], *args: Any) -> T:
                    # aiosqlite's own way into its thread (also behind its execute()).
                    whole = conn._execute(_whole, conn._conn, busy_ms, fn, *args)  # type: ignore[no-untyped-call]
                    result: T = await whole
                    return result

                yield run
        except TimeoutError:
            raise BackendUnavailable(
                f"SQLite {what} on {self.path} timed out after {timeout:.3g}s"
            ) from None
        except (sqlite3.Error, ValueError) as exc:
            raise _translate(exc, self.path) from exc
        except OSError as exc:
            raise BackendUnavailable(f"SQLite file {self.path}: {exc.strerror or exc}") from exc

    async def _connection(self) -> aiosqlite.Connection:
        """The open connection, or a new one on a ready file (also after a transient failure)."""
        if self._closed:
            raise BackendUnavailable(f"SQLite backend for {self.path} is closed")
        if self._conn is not None:
            return self._conn
        self._boot_id = await asyncio.to_thread(self._preflight)
        alone = await asyncio.to_thread(self._directory.acquire)
        try:
            conn = await aiosqlite.connect(
                self.path, timeout=self._busy_timeout, isolation_level=None
            )
            try:
                if not await conn._execute(persist_wal, conn._conn, self.path):  # type: ignore[no-untyped-call]
                    log.warning("SQLite file %s: cannot keep its WAL on close", self.path)
                await prepare(conn, self.table, self._elections, alone, self._boot_id)
                self._identity = self._identity or FileIdentity.of(self.path)
            except BaseException:
                await conn.close()
                raise
        finally:
            self._directory.share()
        self._conn = conn
        return conn

    def _preflight(self) -> str:
        """Fail clearly before SQLite does; return the kernel boot id."""
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise BackendFatal(f"SQLite file {self.path}: directory {directory} does not exist")
        refuse_shared_filesystem(directory)
        return boot_id()

    async def _read(self, election: str, timeout: float, members: bool = False) -> Lease:
        async with self._request("read", timeout) as run:
            row, now, listed = await run(self._look, election, members)
            return self._lease(election, row, now, listed)

    def _look(
        self, db: sqlite3.Connection, election: str, members: bool
    ) -> tuple[_Row | None, float, tuple[Member, ...]]:
        row = _fetch(db, self._select, election)
        now = boottime()
        if not members:  # a waiter's reads need none
            return row, now, ()
        return row, now, records.members(db, self.table, election, self._boot_id, now)

    def _clock(self, now: float, ttl: float) -> dict[str, Any]:
        """How a member's heartbeat is timed: this host's clocks, and the member's ttl."""
        return {"wall": iso(wall_time()), "boot_id": self._boot_id, "now": now, "ttl": ttl}

    def _check_foreign(self, election: str, row: _Row | None) -> None:
        if row is not None:
            self._foreign.check(election, row[5], row[7], self._boot_id)

    def _lease(
        self, election: str, row: _Row | None, now: float, members: tuple[Member, ...] = ()
    ) -> Lease:
        if row is None:
            lease = Lease(election, None, "", 0, None, None, members=members)
        else:
            lease = replace(_lease(election, row, now, self._boot_id), members=members)
            self._foreign.check(election, row[5], row[7], self._boot_id)
        # A holder's lease lapsing, or a reservation ending, is a change waiters must hear of.
        left = lease.expires_in or lease.reserved_in
        lapse = None if not left else now + left
        self._seen[election] = (_holding(lease), lapse)
        return lease


def _holding(lease: Lease) -> tuple[str | None, str, int]:
    return lease.holder, lease.instance, lease.term


def _lease(election: str, row: _Row, now: float, my_boot_id: str) -> Lease:
    holder, instance, address, term, acquired_at, row_boot_id, expires, version = row[:8]
    reserved_for, reserved_until = row[8], row[9]
    if holder is None:
        # A reservation made on another boot cannot be timed on ours: it has lapsed.
        reserved = bool(reserved_for) and row_boot_id == my_boot_id and reserved_until > now
        return Lease(
            election,
            None,
            "",
            term,
            None,
            None,
            version=str(version),
            reserved_for=str(reserved_for) if reserved else "",
            reserved_in=reserved_until - now if reserved else 0.0,
        )
    # Another boot's clock cannot be read on ours: its lease counts as expired, not free.
    live = row_boot_id == my_boot_id and expires > now
    acquired = dt.datetime.fromisoformat(acquired_at) if acquired_at else None
    expires_in = expires - now if live else 0.0
    return Lease(
        election, holder, address, term, acquired, expires_in, instance, version=str(version)
    )


def _whole(db: sqlite3.Connection, busy_ms: int, fn: Callable[..., T], *args: Any) -> T:
    """In the connection's thread: run ``fn(db, *args)``; whatever happens, no transaction
    stays open to hold the file's write lock."""
    db.execute(f"PRAGMA busy_timeout = {busy_ms}")
    try:
        return fn(db, *args)
    finally:
        if db.in_transaction:
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")


def _execute(db: sqlite3.Connection, sql: str, params: dict[str, Any]) -> None:
    db.execute(sql, params)


def _fetch(db: sqlite3.Connection, sql: str, election: str) -> _Row | None:
    row: Any = db.execute(sql, (election,)).fetchone()
    return None if row is None else tuple(row)


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
