"""postgresql+advisory:// — a session advisory lock per election, held by a live session.

Each election has one dedicated connection (its lock session). A standby blocks in
``pg_advisory_lock(key)`` (bounded by ``lock_timeout`` ≈ ``wait``), so a released lock
passes on within a round trip; once granted, the same session bumps ``term`` in the
companion table, so the term is a real fencing token. The holder proves its session
alive (and still holding the lock, via ``pg_locks``) with one query per renewal.

The session is configured so that the server never ends it — and so never releases the
lock — before the old leader's local deadline: ``idle_session_timeout``,
``tcp_keepalives_*`` and ``tcp_user_timeout`` are all at least one ``ttl`` after the
last request (docs/postgresql.md has the argument). Any doubt about the session while
holding (a failed keepalive, a closed connection) is answered "not held" first, and
the session is only closed on the next call, after the engine has stepped down.

Key: the first 8 bytes of sha256(b"leaderd:" + election, UTF-8) as a signed bigint.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from .base import Backend, BackendFatal, BackendUnavailable, Candidate, Lease
from .pgcommon import (
    DRIVER_ERRORS,
    Listener,
    PgSettings,
    close_quietly,
    notify_channel,
    quote_literal_ms,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS {t} (
    election    text PRIMARY KEY,
    lock_key    bigint NOT NULL,     -- the pg_advisory_lock key
    holder      text,                -- NULL when released
    address     text NOT NULL DEFAULT '',
    term        bigint NOT NULL,     -- fencing token; never decreases
    acquired_at timestamptz,
    released_at timestamptz,
    pid         integer,             -- pg_backend_pid() of the holder's lock session
    expires_at  timestamptz          -- last keepalive + ttl: the holder's lease, at most
)
"""

_MY_LOCK = """EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted
    AND l.objsubid = 1 AND ((l.classid::int8 << 32) | l.objid::int8) = $1 AND l.pid = {pid})"""

_TRY_LOCK = "SELECT pg_try_advisory_lock($1) AS granted, pg_backend_pid() AS pid"
# lock_timeout is set local to this one-statement transaction, before the lock is waited for.
_LOCK = """
WITH cfg AS MATERIALIZED (SELECT set_config('lock_timeout', $2, true))
SELECT pg_advisory_lock($1)::text IS NOT NULL AS granted, pg_backend_pid() AS pid FROM cfg
"""
_BUMP = """
WITH bumped AS (
INSERT INTO {t} AS c (election, lock_key, holder, address, term, acquired_at, released_at, pid,
                      expires_at)
VALUES ($1, $2, $3, $4, 1, now(), NULL, pg_backend_pid(), now() + make_interval(secs => $6))
ON CONFLICT (election) DO UPDATE SET lock_key = excluded.lock_key, holder = excluded.holder,
    address = excluded.address, term = c.term + 1, acquired_at = now(), released_at = NULL,
    pid = excluded.pid, expires_at = excluded.expires_at
RETURNING term, acquired_at, pid
)
SELECT term, acquired_at, pid, pg_notify($5, term || ' acquired ' || $1)::text FROM bumped
"""
# $1 key, $2 election, $3 ttl: proves the session alive and still holding the lock, and
# moves the lease a successor must wait out if this session ends without a release.
_KEEPALIVE = (
    """
WITH kept AS (
    UPDATE {t} SET expires_at = now() + make_interval(secs => $3)
    WHERE election = $2 AND pid = pg_backend_pid() AND """
    + _MY_LOCK.format(pid="pg_backend_pid()")
    + """ RETURNING 1
)
SELECT pg_backend_pid() AS pid, EXISTS (SELECT FROM kept) AS held
"""
)
# $1 election, $2 candidate: another node that held the lock and never released it (its
# session ended under it: crash, pg_terminate_backend, restart), and how long its lease
# may still run on the server clock. This node's own old session needs no wait: its
# engine heard "not held" before it asked again.
_UNRELEASED = """
SELECT holder, address, term, acquired_at,
       GREATEST(0, EXTRACT(EPOCH FROM expires_at - now()))::float8 AS expires_in
FROM {t} WHERE election = $1 AND holder IS NOT NULL AND holder <> $2 AND released_at IS NULL
    AND pid IS DISTINCT FROM pg_backend_pid() AND expires_at > now()
"""
# $1 key, $2 election: the companion row and the session (if any) holding the lock; a
# holder counts only while its recorded session holds the lock.
_OBSERVE = """
SELECT c.holder, c.address, c.term, c.acquired_at, c.pid, l.pid AS lock_pid
FROM (SELECT) AS one
LEFT JOIN {t} c ON c.election = $2
LEFT JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
    AND ((l.classid::int8 << 32) | l.objid::int8) = $1
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
_RELEASE = """
WITH r AS (
    UPDATE {t} SET holder = NULL, address = '', released_at = now()
    WHERE election = $2 AND term = $3 AND pid = pg_backend_pid() RETURNING 1
)
SELECT pg_advisory_unlock($1), CASE WHEN n > 0
    THEN pg_notify($4, $3::bigint || ' released ' || $2)::text END
FROM (SELECT count(*) AS n FROM r) AS marked
"""

_DEFAULT_TIMEOUT = 5.0
_DEFAULT_TTL = 15.0
_PENDING_READS = 12  # about 0.15 s of re-reads while a new holder bumps its term
_POOLER = (
    "the advisory backend needs a direct session to PostgreSQL, but the server process "
    "changed under it (pid {a} then {b}): a transaction-mode pooler such as PgBouncer is "
    "in the way; point the URL at PostgreSQL itself"
)


def advisory_key(election: str) -> int:
    """The lock key: sha256("leaderd:" + election)[:8] as a signed 64-bit integer."""
    digest = hashlib.sha256(b"leaderd:" + election.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def session_settings(ttl: float) -> dict[str, str]:
    """GUCs of a lock session: the server may end it only >= ttl after its last request."""
    return {
        "idle_session_timeout": quote_literal_ms(math.ceil(ttl * 1000) / 1000),
        "tcp_user_timeout": str(math.ceil(ttl * 1000)),
        "tcp_keepalives_idle": str(math.ceil(ttl)),
        "tcp_keepalives_interval": str(max(1, math.ceil(ttl / 3))),
        "tcp_keepalives_count": "3",
        # A standby that went away while blocked leaves the lock queue within this.
        "client_connection_check_interval": "500ms",
    }


@dataclass
class _Session:
    """One election's dedicated connection and what this node holds through it."""

    election: str
    key: int
    conn: Any = None
    ttl: float | None = None
    term: int | None = None  # set while this session holds the lock
    pid: int = 0
    address: str = ""
    acquired_at: dt.datetime | None = None
    last_term: int = 0
    lost: bool = False  # the session ended while holding: report "not held" once
    # The lock is granted but not yet claimed: waiting out an unreleased holder's lease.
    granted: bool = False
    stale: bool = False  # in doubt (a keepalive failed): close before the next use


class PostgresAdvisoryBackend(Backend):
    kind = "postgresql+advisory"

    def __init__(self, settings: PgSettings) -> None:
        self._pg = settings
        table = settings.qualified_table
        self._sql_bump = _BUMP.format(t=table)
        self._sql_keepalive = _KEEPALIVE.format(t=table)
        self._sql_unreleased = _UNRELEASED.format(t=table)
        self._sql_observe = _OBSERVE.format(t=table)
        self._sql_release = _RELEASE.format(t=table)
        self._sessions: dict[str, _Session] = {}
        self._listener = Listener(settings, notify_channel(settings.table))
        self._table_ready = False
        self._closing: set[asyncio.Task[None]] = set()

    @classmethod
    def from_url(cls, url: str) -> PostgresAdvisoryBackend:
        return cls(PgSettings.from_url(url, default_table="leaderd_advisory"))

    @property
    def description(self) -> str:
        return self._pg.description

    async def open(self, elections: Sequence[str]) -> None:
        for election in elections:
            self._session(election)
        self._listener.start()
        conn = await self._pg.connect(self._pg.connect_timeout, {})
        try:
            async with asyncio.timeout(_DEFAULT_TIMEOUT):
                await self._prepare(conn)
        except TimeoutError:
            raise BackendUnavailable(
                f"creating the table on {self.description}: timed out"
            ) from None
        except DRIVER_ERRORS as exc:
            raise self._pg.error(exc, "creating the table") from None
        finally:
            conn.terminate()
        await self._listener.ready(self._pg.connect_timeout)

    async def observe(self, election: str) -> Lease:
        s = self._session(election)
        if s.granted:
            self._drop(s)  # cooling down: a lock waiting to be claimed goes back
        lease = await self._guard(
            s, "reading the lock", _DEFAULT_TIMEOUT, self._observe, s, election
        )
        return self._saw(lease)

    async def acquire_or_renew(
        self, election: str, candidate: Candidate, ttl: float, timeout: float, wait: float = 0.0
    ) -> Lease:
        lease = await self._acquire_or_renew(election, candidate, ttl, timeout, wait)
        return self._saw(lease)

    async def _acquire_or_renew(
        self, election: str, candidate: Candidate, ttl: float, timeout: float, wait: float
    ) -> Lease:
        s = self._session(election)
        if s.lost:  # the session ended under the holder: say so before anything else
            s.lost = False
            return _free(election, s.last_term)
        if s.term is not None:
            return await self._keepalive(s, election, candidate, ttl, timeout)
        return await self._guard(
            s,
            "acquiring the lock",
            timeout,
            self._campaign,
            s,
            election,
            candidate,
            ttl,
            wait,
            timeout,
        )

    async def release(self, election: str, candidate: Candidate, term: int) -> None:
        s = self._session(election)
        if s.term is None or s.term != term or s.conn is None:
            return
        s.term = None
        try:
            async with asyncio.timeout(_DEFAULT_TIMEOUT):
                await s.conn.execute(
                    self._sql_release, s.key, election, term, self._listener.channel
                )
        except (*DRIVER_ERRORS, TimeoutError) as exc:
            self._drop(s)  # ending the session releases the lock for sure
            raise self._pg.error(exc, "releasing the lock") from None

    async def wait_for_change(self, election: str, timeout: float) -> None:
        await self._listener.wait(election, timeout)

    async def close(self) -> None:
        for s in self._sessions.values():
            s.term = None
            self._drop(s)
        await self._listener.stop()
        await asyncio.gather(*self._closing)

    def _saw(self, lease: Lease) -> Lease:
        self._listener.saw(lease.election, lease.term, held=lease.holder is not None)
        return lease

    # -- the three paths --------------------------------------------------------

    async def _campaign(
        self,
        s: _Session,
        election: str,
        candidate: Candidate,
        ttl: float,
        wait: float,
        timeout: float,
    ) -> Lease:
        conn = await self._connection(s, ttl, timeout)
        if not s.granted:
            # Keep up to a second of the budget for the term bump after the grant.
            lock_wait = min(wait, timeout - min(1.0, timeout / 2))
            if lock_wait >= 0.001:
                row = await self._wait_for_lock(s, conn, election, lock_wait)
            else:
                row = await conn.fetchrow(_TRY_LOCK, s.key)
            if row is None or not row["granted"]:
                return await self._observe(s, election)
            self._check_pid(s, conn, row["pid"])
            s.granted = True
        if self._pg.takeover == "wait":
            previous = await conn.fetchrow(self._sql_unreleased, election, candidate.node_id)
            if previous is not None:
                # Its session ended without a release, so that node may still be alive and
                # answering "leader" until its lease runs out: hold the lock, claim nothing.
                return _unreleased(election, previous)
        bumped = await conn.fetchrow(
            self._sql_bump,
            election,
            s.key,
            candidate.node_id,
            candidate.address,
            self._listener.channel,
            ttl,
        )
        self._check_pid(s, conn, bumped["pid"])
        s.granted = False
        s.term = s.last_term = int(bumped["term"])
        s.pid, s.address, s.acquired_at = (
            int(bumped["pid"]),
            candidate.address,
            bumped["acquired_at"],
        )
        return self._held(s, election, candidate)

    async def _wait_for_lock(
        self, s: _Session, conn: Any, election: str, lock_wait: float
    ) -> Any | None:
        """Block in pg_advisory_lock up to ``lock_wait``; give up early when another node
        announces it acquired the lock, so this follower names the new leader at once."""
        lock = asyncio.ensure_future(conn.fetchrow(_LOCK, s.key, quote_literal_ms(lock_wait)))
        news = asyncio.ensure_future(self._listener.acquired(election, lock_wait))
        try:
            await asyncio.wait({lock, news}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            news.cancel()
        if not lock.done():
            # Ending the session cancels the wait, and releases a lock granted meanwhile.
            lock.cancel()
            self._drop(s)
            await asyncio.gather(lock, return_exceptions=True)
            return None
        try:
            return lock.result()
        except asyncpg.LockNotAvailableError:
            return None

    async def _keepalive(
        self, s: _Session, election: str, candidate: Candidate, ttl: float, timeout: float
    ) -> Lease:
        try:
            if timeout <= 0 or s.conn is None:
                raise TimeoutError
            async with asyncio.timeout(timeout):
                row = await s.conn.fetchrow(self._sql_keepalive, s.key, election, ttl)
        except Exception:  # whatever went wrong (even asyncpg internals), it is in doubt
            # In doubt: not held. The session is closed on the next call, once the engine
            # has stepped down, never while it may still answer "leader".
            s.term, s.stale = None, True
            return _free(election, s.last_term)
        if row["pid"] != s.pid:
            s.term, s.stale = None, True
            raise BackendFatal(_POOLER.format(a=s.pid, b=row["pid"]))
        if not row["held"]:
            s.term, s.stale = None, True
            return _free(election, s.last_term)
        return self._held(s, election, candidate)

    async def _observe(self, s: _Session, election: str) -> Lease:
        """The holder named by the companion row, if its recorded session holds the lock.
        A session that holds the lock but is not recorded yet is between its grant and its
        term bump (one round trip): read again shortly rather than report "free"."""
        conn = await self._connection(s, s.ttl or _DEFAULT_TTL, _DEFAULT_TIMEOUT)
        for attempt in range(_PENDING_READS):
            row = await conn.fetchrow(self._sql_observe, s.key, election)
            term = 0 if row["term"] is None else int(row["term"])
            s.last_term = max(s.last_term, term)
            if row["lock_pid"] is None:
                return _free(election, term)
            if row["lock_pid"] == row["pid"] and row["holder"] is not None:
                return Lease(
                    election, row["holder"], row["address"], term, row["acquired_at"], None
                )
            await asyncio.sleep(0.002 * (attempt + 1))
        return _free(election, term)

    # -- the lock session -------------------------------------------------------

    async def _guard(self, s: _Session, doing: str, timeout: float, op: Any, *args: Any) -> Lease:
        """Run a request on the session within ``timeout``; on any failure close the
        session (it may hold a lock granted at the last moment: ending it releases it)."""
        if timeout <= 0:
            raise BackendUnavailable(f"{doing} on {self.description}: no time left")
        try:
            async with asyncio.timeout(timeout):
                lease: Lease = await op(*args)
                return lease
        except BaseException as exc:
            self._drop(s)
            if isinstance(exc, TimeoutError):
                raise BackendUnavailable(
                    f"{doing} on {self.description}: timed out after {timeout:.3g}s"
                ) from None
            if isinstance(exc, OSError | asyncpg.PostgresError | asyncpg.InterfaceError):
                raise self._pg.error(exc, doing) from None
            raise

    async def _connection(self, s: _Session, ttl: float, timeout: float) -> Any:
        if s.stale or (s.conn is not None and s.conn.is_closed()):
            self._drop(s)
        if s.conn is None:
            conn = await self._pg.connect(timeout, session_settings(ttl))
            s.conn, s.ttl = conn, ttl
            conn.add_termination_listener(lambda c: self._on_closed(s, c))
            if not self._table_ready:
                await self._prepare(conn)
        elif s.ttl != ttl:
            settings = session_settings(ttl)
            calls = (f"set_config('{k}', ${i}, false)" for i, k in enumerate(settings, 1))
            await s.conn.execute("SELECT " + ", ".join(calls), *settings.values())
            s.ttl = ttl
        return s.conn

    async def _prepare(self, conn: Any) -> None:
        if conn.get_server_version().major < 14:
            raise BackendFatal(
                f"{self.description}: the advisory backend needs PostgreSQL 14 or later "
                "(idle_session_timeout)"
            )
        if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", self._pg.qualified_table):
            with contextlib.suppress(
                asyncpg.DuplicateTableError,
                asyncpg.DuplicateObjectError,
                asyncpg.UniqueViolationError,
            ):
                await conn.execute(_SCHEMA.format(t=self._pg.qualified_table))
        self._table_ready = True

    def _check_pid(self, s: _Session, conn: Any, pid: int) -> None:
        if pid != conn.get_server_pid():
            self._drop(s)
            raise BackendFatal(_POOLER.format(a=conn.get_server_pid(), b=pid))

    def _on_closed(self, s: _Session, conn: Any) -> None:
        if s.conn is not conn:  # we closed it ourselves
            return
        s.conn, s.granted = None, False
        if s.term is not None:
            s.term, s.lost = None, True
        self._listener.wake(s.election)

    def _drop(self, s: _Session) -> None:
        """Forget the session's connection and close it in the background: asyncpg first
        cancels a statement still running (a blocked pg_advisory_lock), then terminates."""
        conn, s.conn, s.stale, s.granted = s.conn, None, False, False
        if conn is None or conn.is_closed():
            return
        task = asyncio.get_running_loop().create_task(close_quietly(conn))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _session(self, election: str) -> _Session:
        s = self._sessions.get(election)
        if s is None:
            s = self._sessions[election] = _Session(election, advisory_key(election))
        return s

    @staticmethod
    def _held(s: _Session, election: str, candidate: Candidate) -> Lease:
        assert s.term is not None
        return Lease(election, candidate.node_id, s.address, s.term, s.acquired_at, None)


def _unreleased(election: str, row: Any) -> Lease:
    """The previous holder, as a lease that runs out when its last keepalive allows."""
    expires_in = max(float(row["expires_in"]), 0.001)
    term = int(row["term"])
    return Lease(election, row["holder"], row["address"], term, row["acquired_at"], expires_in)


def _free(election: str, term: int) -> Lease:
    return Lease(election, None, "", term, None, None)
