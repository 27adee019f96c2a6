"""sqlite:// — one lease row per election in a SQLite file shared by the daemons of one host.

Acquire and renew are one compare-and-set UPSERT inside ``BEGIN IMMEDIATE``; the file is in
WAL mode with ``synchronous=FULL`` so a granted term survives power loss. Expiry is judged on
this host's CLOCK_BOOTTIME (the clock the engine self-fences on: it never steps and counts
suspend) plus the kernel boot id stored in the row. A row written under another boot id is
never live, but never free either: like any unreleased lease it is taken over only when the
engine names the version it watched for one ttl. host.py holds the guards that keep
the file to one host; wake.py how standbys hear a commit; proof.py how they take a
dead holder's lease at once; rows.py reads the row; boundary.py runs one request and
translates its errors; url.py parses the URL. See docs/sqlite.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from typing import Any

import aiosqlite

from ...clock import boottime, wall_time
from ..asks import Ask, Release
from ..base import (
    Backend,
    BackendError,
    BackendUnavailable,
    Candidate,
    Capabilities,
    Grant,
    Lease,
    heard_in,
)
from ..records import Member, Tenure, end_text
from . import grant as sqlite_grant
from . import records
from .boundary import Run, T, translate, whole
from .host import (
    DirectoryLock,
    FileIdentity,
    ForeignWriters,
    persist_wal,
    preflight,
)
from .proof import HolderLock
from .records import iso
from .rows import Row, fetch, holder_proof, holding, lease_of, names
from .schema import CAS, RELEASE, SELECT, prepare
from .url import DEFAULT_BUSY_TIMEOUT_MS, DEFAULT_POLL_INTERVAL_MS, DEFAULT_TABLE, parse_url
from .wake import CommitWatcher

log = logging.getLogger(__name__)


class SQLiteBackend(Backend):
    """Lease rows in one SQLite file; every daemon on the host opens the same file."""

    kind = "sqlite"
    capabilities = Capabilities()

    def __init__(
        self,
        path: str,
        table: str = DEFAULT_TABLE,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        poll_interval_ms: float = DEFAULT_POLL_INTERVAL_MS,
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
        self._proof = HolderLock(path, table)
        # Per election: (holder, instance, term) as last read, and when that lease lapses on
        # CLOCK_BOOTTIME; a renewal is no change a waiter must hear of.
        self._seen: dict[str, tuple[tuple[str | None, str, int], float | None]] = {}
        self._me: dict[str, Candidate] = {}  # per election: who asks here (told of a grant)

    @classmethod
    def from_url(cls, url: str) -> SQLiteBackend:
        path, table, busy, poll, crash_failover = parse_url(url)
        backend = cls(path, table, busy, poll)
        if crash_failover == "ttl":
            backend.ttl_rule_only()  # for apps that act for valid_for_ms after an answer
        return backend

    @property
    def description(self) -> str:
        return f"sqlite://{self.path}?table={self.table}"

    def ttl_rule_only(self) -> None:
        self._proof.enabled = False

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
    ) -> tuple[Row | None, float, tuple[Member, ...]]:
        """A cooling-down candidate's read, with its heartbeat: one transaction, one hop."""
        db.execute("BEGIN IMMEDIATE")
        now = boottime()
        records.heard(db, self.table, election, me, self._clock(now, ttl), campaigning=False)
        row = fetch(db, self._select, election)
        members = records.members(db, self.table, election, self._boot_id, now)
        db.execute("COMMIT")
        return row, now, members

    async def acquire_or_renew(self, ask: Ask) -> Lease:
        election, candidate = ask.election, ask.candidate
        params = {
            "election": election,
            "holder": candidate.node_id,
            "instance": candidate.instance,
            "address": candidate.address,
            "ttl": ask.ttl,
            "min_term": ask.min_term,
            "takeover": int(ask.takeover) if ask.takeover.isdigit() else -1,
            "lost_term": ask.lost_term,
        }
        self._me[election] = candidate
        async with self._request("acquire", ask.timeout) as run:
            row, now, members = await run(self._claim, params, candidate)
            return heard_in(self._lease(election, row, now, members), candidate)

    def _claim(
        self, db: sqlite3.Connection, ask: dict[str, Any], me: Candidate
    ) -> tuple[Row | None, float, tuple[Member, ...]]:
        """The compare-and-set, the member's heartbeat and the history record, in the
        connection's thread: one transaction, one hop."""
        election = ask["election"]
        db.execute("BEGIN IMMEDIATE")
        now = boottime()  # read under the write lock: no one can commit in between
        before = fetch(db, self._select, election)
        self._check_foreign(election, before)
        proof, gone = self._proof.ask(election, me.instance, holder_proof(before, self._boot_id))
        wall = wall_time()
        db.execute(
            CAS.format(table=self.table),
            {
                **ask,
                "takeover": before[7] if before and gone else ask["takeover"],
                "proof": proof,
                "gone": gone,
                "wall": iso(wall),
                "expires_at": iso(wall + ask["ttl"]),
                "boot_id": self._boot_id,
                "now": now,
                "expires": now + ask["ttl"],
            },
        )
        row = fetch(db, self._select, election)
        records.heard(db, self.table, election, me, self._clock(now, ask["ttl"]), campaigning=True)
        clock = (wall, now, self._boot_id)
        records.began(db, self.table, election, me, (before, row), clock, died=bool(gone))
        if ask["lost_term"]:
            records.lost(db, self.table, election, me, ask["lost_term"])
        members = records.members(db, self.table, election, self._boot_id, now)
        db.execute("COMMIT")
        self._proof.settle(election, names(row, me))
        return row, now, members

    async def release(self, release: Release) -> None:
        async with self._request("release", self._busy_timeout) as run:
            params = {
                "election": release.election,
                "holder": release.candidate.node_id,
                "instance": release.candidate.instance,
                "term": release.term,
                "reserve_for": release.reserve_for,
                "reserve_ttl": release.ttl if release.reserve_for else 0.0,
                "boot_id": self._boot_id,
                "version": release.version,
            }
            # One transaction: its commit bumps data_version, which wakes standbys.
            await run(self._release, params, release)

    def _release(self, db: sqlite3.Connection, params: dict[str, Any], release: Release) -> None:
        db.execute("BEGIN IMMEDIATE")
        wall = wall_time()  # read under the write lock, as the member ages it compares
        params = {**params, "wall": iso(wall), "wall_seconds": wall, "now": boottime()}
        heir = None if release.reserve_for else release.heir
        granted = heir is not None and sqlite_grant.grant(db, self.table, params, heir)
        ended = granted or db.execute(RELEASE.format(table=self.table), params).rowcount > 0
        if ended:
            records.released(db, self.table, params, end_text(release.reason, release.reserve_for))
        records.withdrawn(db, self.table, params)
        db.execute("COMMIT")
        self._proof.settle(params["election"], mine=not ended)  # a release that missed keeps it

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
                if seen is not None and holding(lease) != seen[0]:
                    return granted
                # The holder's lock is ours: it died, or it released, which commits before it
                # unlocks. A read that came before that commit cannot tell: read again.
                if self._proof.freed(election):
                    before = holding(lease)
                    lease, granted = await self._look_for_grant(election, deadline)
                    return granted if holding(lease) != before else None  # died: a round
                self._proof.watch(election, self._commits.wake)
                seen = seen or (holding(lease), None)
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
    ) -> tuple[Row | None, float, sqlite_grant.Heartbeat | None]:
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
        self._proof.close()
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
                    call = conn._execute(whole, conn._conn, busy_ms, fn, *args)  # type: ignore[no-untyped-call]
                    result: T = await call
                    return result

                yield run
        except TimeoutError:
            raise BackendUnavailable(
                f"SQLite {what} on {self.path} timed out after {timeout:.3g}s"
            ) from None
        except (sqlite3.Error, ValueError) as exc:
            raise translate(exc, self.path) from exc
        except OSError as exc:
            raise BackendUnavailable(f"SQLite file {self.path}: {exc.strerror or exc}") from exc

    async def _connection(self) -> aiosqlite.Connection:
        """The open connection, or a new one on a ready file (also after a transient failure)."""
        if self._closed:
            raise BackendUnavailable(f"SQLite backend for {self.path} is closed")
        if self._conn is not None:
            return self._conn
        self._boot_id = await asyncio.to_thread(preflight, self.path)
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
                self._proof.open()
            except BaseException:
                await conn.close()
                raise
        finally:
            self._directory.share()
        self._conn = conn
        return conn

    async def _read(self, election: str, timeout: float, members: bool = False) -> Lease:
        async with self._request("read", timeout) as run:
            row, now, listed = await run(self._look, election, members)
            return self._lease(election, row, now, listed)

    def _look(
        self, db: sqlite3.Connection, election: str, members: bool
    ) -> tuple[Row | None, float, tuple[Member, ...]]:
        row = fetch(db, self._select, election)
        now = boottime()
        if not members:  # a waiter's reads need none
            return row, now, ()
        return row, now, records.members(db, self.table, election, self._boot_id, now)

    def _clock(self, now: float, ttl: float) -> dict[str, Any]:
        """How a member's heartbeat is timed: this host's clocks, and the member's ttl."""
        return {"wall": iso(wall_time()), "boot_id": self._boot_id, "now": now, "ttl": ttl}

    def _check_foreign(self, election: str, row: Row | None) -> None:
        if row is not None:
            self._foreign.check(election, row[5], row[7], self._boot_id)

    def _lease(
        self, election: str, row: Row | None, now: float, members: tuple[Member, ...] = ()
    ) -> Lease:
        if row is None:
            lease = Lease(election, None, "", 0, None, None, members=members)
        else:
            lease = replace(lease_of(election, row, now, self._boot_id), members=members)
            self._foreign.check(election, row[5], row[7], self._boot_id)
            self._proof.saw(election, *holder_proof(row, self._boot_id))
        # A holder's lease lapsing, or a reservation ending, is a change waiters must hear of.
        left = lease.expires_in or lease.reserved_in
        lapse = None if not left else now + left
        self._seen[election] = (holding(lease), lapse)
        return lease
