"""postgresql:// — one lease row per election, expiry judged on the server's clock.

Every acquire-or-renew is ONE statement (an upsert whose conflict arm applies only when
the row is ours, free or expired, plus a read of the row when it did not apply), so a
request is one round trip. ``now()`` is the start of that single-statement transaction:
after the request was sent and before any row lock was waited for, so the lease the
server records (``now() + ttl``) always ends after the leader's local deadline
(``t_send + ttl * (1 - drift) - margin``), and a waiting acquirer judges expiry with a
``now()`` that is, if anything, early — both errors are on the safe side, and every
timestamp written by one statement agrees. ``clock_timestamp()`` would be later (also
safe) but differs between the places it is evaluated within one statement.

Acquisitions and releases ``pg_notify`` the channel ``leaderd_<table>`` with the
election as payload; a dedicated connection LISTENs so that standbys wake at once.
Requests share a small pool (one connection per concurrently served election, at most
eight), so one hung statement never delays another election's renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg

from .base import Backend, BackendError, BackendUnavailable, Candidate, Lease
from .pgcommon import DRIVER_ERRORS, Deadline, Listener, PgSettings, close_quietly, notify_channel

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS {t} (
    election    text PRIMARY KEY,
    holder      text,                         -- NULL when released
    address     text NOT NULL DEFAULT '',
    term        bigint NOT NULL,              -- fencing token; never decreases
    acquired_at timestamptz,                  -- start of the current holder's term
    renewed_at  timestamptz,
    expires_at  timestamptz NOT NULL          -- server clock; free once <= now()
)
"""

_LEASE_COLUMNS = """
    CASE WHEN expires_at > now() THEN holder END AS holder, address, term, acquired_at,
    extract(epoch FROM expires_at - now())::float8 AS expires_in"""

# $1 election, $2 holder, $3 address, $4 ttl seconds, $5 channel.
_ACQUIRE = """
WITH cas AS (
    INSERT INTO {t} AS l (election, holder, address, term, acquired_at, renewed_at, expires_at)
    VALUES ($1, $2, $3, 1, now(), now(), now() + make_interval(secs => $4))
    ON CONFLICT (election) DO UPDATE SET
        holder = excluded.holder,
        address = excluded.address,
        term = CASE WHEN l.holder = excluded.holder AND l.expires_at > now()
                    THEN l.term ELSE l.term + 1 END,
        acquired_at = CASE WHEN l.holder = excluded.holder AND l.expires_at > now()
                           THEN l.acquired_at ELSE now() END,
        renewed_at = now(),
        expires_at = excluded.expires_at
    WHERE l.holder = excluded.holder OR l.holder IS NULL OR l.expires_at <= now()
    RETURNING l.*
)
SELECT {cols},
    CASE WHEN acquired_at = now() THEN pg_notify($5, term || ' acquired ' || $1)::text END
FROM cas
UNION ALL
SELECT {cols}, NULL FROM {t} WHERE election = $1 AND NOT EXISTS (SELECT FROM cas)
"""

_OBSERVE = "SELECT {cols} FROM {t} WHERE election = $1"

# $1 election, $2 holder, $3 term, $4 channel.
_RELEASE = """
WITH released AS (
    UPDATE {t} SET holder = NULL, address = '', renewed_at = now(), expires_at = now()
    WHERE election = $1 AND holder = $2 AND term = $3
    RETURNING election, term
)
SELECT pg_notify($4, term || ' released ' || election)::text FROM released
"""

_DEFAULT_TIMEOUT = 5.0  # observe and release have no timeout argument
_MAX_POOL = 8
_CLOSED = (asyncpg.ConnectionDoesNotExistError, ConnectionResetError, BrokenPipeError)


class PostgresLeaseBackend(Backend):
    kind = "postgresql"

    def __init__(self, settings: PgSettings) -> None:
        self._pg = settings
        table = settings.qualified_table
        self._sql_acquire = _ACQUIRE.format(t=table, cols=_LEASE_COLUMNS)
        self._sql_observe = _OBSERVE.format(t=table, cols=_LEASE_COLUMNS)
        self._sql_release = _RELEASE.format(t=table)
        self._listener = Listener(settings, notify_channel(settings.table))
        self._pool = _Pool(settings, size=4)
        self._table_ready = False

    @classmethod
    def from_url(cls, url: str) -> PostgresLeaseBackend:
        return cls(PgSettings.from_url(url, default_table="leaderd_lease"))

    @property
    def description(self) -> str:
        return self._pg.description

    @property
    def listening(self) -> bool:
        """True while the LISTEN connection is up (else standbys poll)."""
        return self._listener.listening

    async def open(self, elections: Sequence[str]) -> None:
        self._pool.size = max(1, min(len(elections), _MAX_POOL))
        self._listener.start()
        await self._request("creating the lease table", _DEFAULT_TIMEOUT, self._noop)
        await self._listener.ready(self._pg.connect_timeout)

    async def observe(self, election: str) -> Lease:
        rows = await self._request(
            "reading the lease", _DEFAULT_TIMEOUT, self._fetch, self._sql_observe, election
        )
        return self._saw(_lease(election, rows[0] if rows else None))

    async def acquire_or_renew(
        self, election: str, candidate: Candidate, ttl: float, timeout: float, wait: float = 0.0
    ) -> Lease:
        args = (election, candidate.node_id, candidate.address, float(ttl), self._listener.channel)
        for _ in range(3):
            rows = await self._request(
                "acquiring the lease", timeout, self._fetch, self._sql_acquire, *args
            )
            if rows:
                return self._saw(_lease(election, rows[0]))
            # A concurrent first INSERT won, after this statement's snapshot: read again.
        raise BackendUnavailable(f"acquiring the lease on {self.description}: lost three races")

    async def release(self, election: str, candidate: Candidate, term: int) -> None:
        await self._request(
            "releasing the lease",
            _DEFAULT_TIMEOUT,
            self._fetch,
            self._sql_release,
            election,
            candidate.node_id,
            term,
            self._listener.channel,
        )

    async def wait_for_change(self, election: str, timeout: float) -> None:
        await self._listener.wait(election, timeout)

    async def close(self) -> None:
        await self._listener.stop()
        await self._pool.close()

    def _saw(self, lease: Lease) -> Lease:
        self._listener.saw(lease.election, lease.term, held=lease.holder is not None)
        return lease

    # -- requests ---------------------------------------------------------------

    async def _request(self, doing: str, timeout: float, op: Any, *args: Any) -> Any:
        """Run ``op(conn, *args)`` on a pooled connection, all within ``timeout``."""
        if timeout <= 0:
            raise BackendUnavailable(f"{doing} on {self.description}: no time left")
        deadline = Deadline(timeout)
        try:
            async with asyncio.timeout(timeout):
                try:
                    return await self._attempt(deadline, op, *args)
                except _CLOSED:
                    # The server closed a pooled connection (restart, terminate): retry once
                    # on a new one. Harmless even if the first one was applied: a repeated
                    # acquisition is a renewal, a repeated release a no-op.
                    return await self._attempt(deadline, op, *args)
        except TimeoutError:
            raise BackendUnavailable(
                f"{doing} on {self.description}: timed out after {timeout:.3g}s"
            ) from None
        except BackendError:
            raise
        except DRIVER_ERRORS as exc:
            raise self._pg.error(exc, doing) from None

    async def _attempt(self, deadline: Deadline, op: Any, *args: Any) -> Any:
        async with self._pool.connection(deadline) as conn:
            if not self._table_ready:
                await self._create_table(conn)
            return await op(conn, *args)

    @staticmethod
    async def _fetch(conn: Any, sql: str, *args: Any) -> list[Any]:
        rows: list[Any] = await conn.fetch(sql, *args)
        return rows

    @staticmethod
    async def _noop(conn: Any) -> None:
        return None

    async def _create_table(self, conn: Any) -> None:
        exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", self._pg.qualified_table)
        if not exists:
            # Two daemons may race to create it; the loser sees the winner's table.
            with contextlib.suppress(
                asyncpg.DuplicateTableError,
                asyncpg.DuplicateObjectError,
                asyncpg.UniqueViolationError,
            ):
                await conn.execute(_SCHEMA.format(t=self._pg.qualified_table))
        self._table_ready = True


class _Pool:
    """Idle connections and a limit on how many are busy; broken ones are dropped."""

    def __init__(self, settings: PgSettings, size: int) -> None:
        self._pg = settings
        self.size = size
        self._busy = 0
        self._free = asyncio.Condition()
        self._idle: list[Any] = []
        self._closing: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def connection(self, deadline: Deadline) -> AsyncIterator[Any]:
        async with self._free:
            await self._free.wait_for(lambda: self._busy < self.size)
            self._busy += 1
        try:
            conn = self._take_idle() or await self._pg.connect(deadline.left(), {})
            try:
                yield conn
            except BaseException:
                self._discard(conn)
                raise
            self._idle.append(conn)
        finally:
            self._busy -= 1
            async with self._free:
                self._free.notify()

    def _take_idle(self) -> Any:
        while self._idle:
            conn = self._idle.pop()
            if not conn.is_closed():
                return conn
        return None

    def _discard(self, conn: Any) -> None:
        """Close in the background, after asyncpg's cancel of the running statement."""
        if conn.is_closed():
            return
        task = asyncio.get_running_loop().create_task(close_quietly(conn))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        await asyncio.gather(*(close_quietly(c) for c in idle), *self._closing)


def _lease(election: str, row: Any) -> Lease:
    if row is None:  # never held
        return Lease(election, None, "", 0, None, None)
    holder: str | None = row["holder"]
    if holder is None:
        return Lease(election, None, "", int(row["term"]), None, None)
    acquired_at: dt.datetime | None = row["acquired_at"]
    return Lease(
        election,
        holder,
        row["address"],
        int(row["term"]),
        acquired_at,
        max(0.0, float(row["expires_in"])),
    )
