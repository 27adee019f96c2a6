"""postgresql:// — one lease row per election, expiry judged on the server's clock.

Every acquire-or-renew is ONE statement (an upsert whose conflict arm applies only when
the row is free, this process's, or expired with the version the engine names, plus a
read of the row when it did not apply), so a request is one round trip. ``now()`` is the
start of that single-statement transaction: after the request was sent and before any row
lock was waited for, so the lease the server records (``now() + ttl``) always ends after
the leader's local deadline (``t_send + ttl * (1 - drift) - margin``), and a waiting
acquirer judges expiry with a ``now()`` that is, if anything, early — both errors are on
the safe side. A server clock stepped forward can expire a live lease early on the server,
but taking it over also needs the version the engine watched unchanged for one ttl on its
own clock, and a renewing holder moves the version every renew_interval (docs/algorithm.md).

Acquisitions and releases ``pg_notify`` the channel ``leaderd_<table>``; a dedicated
connection LISTENs so that standbys wake at once. Requests share a small pool (one
connection per concurrently served election, at most eight), so one hung statement never
delays another election's renewal. Every request runs in conn.request, the one error
boundary, on sessions that commit durably (conn.connect).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import asyncpg

from ..asks import Ask, Heir, Release
from ..base import Backend, BackendUnavailable, Candidate, Capabilities, Grant, Lease, heard_in
from ..records import EndReason, Tenure, end_text
from . import fence, records
from .conn import (
    Closer,
    Deadline,
    close_quietly,
    connect,
    ensure_table,
    request,
    rolled_back,
    version_sql,
)
from .listen import Listener, notify_channel
from .reservation import CLEAR, COLUMNS, RESERVE, lease_from_row, reservation_sql, reserved_sql
from .settings import PgSettings

_SCHEMA = """
CREATE TABLE IF NOT EXISTS {t} (
    election    text PRIMARY KEY,
    holder      text,                         -- node id; NULL when released
    instance    text NOT NULL DEFAULT '',     -- the holder's process token
    address     text NOT NULL DEFAULT '',
    term        bigint NOT NULL,              -- fencing token; never decreases
    acquired_at timestamptz,                  -- start of the current holder's term
    renewed_at  timestamptz,
    expires_at  timestamptz NOT NULL,         -- server clock; over once <= now()
    version     bigint NOT NULL DEFAULT 0,    -- +1 on every write, renewals too
    reserved_for   text,                      -- released for this node id only ...
    reserved_until timestamptz                -- ... until then (server clock)
)
"""
# Columns an older leaderd's table lacks (added on open).
_UPGRADE = {
    "instance": "text NOT NULL DEFAULT ''",
    "version": "bigint NOT NULL DEFAULT 0",
    **COLUMNS,
}

_LEASE_COLUMNS = f"""
    l.holder, l.instance, l.address, l.term, l.acquired_at, {version_sql("l")} AS version,
    GREATEST(0, extract(epoch FROM l.expires_at - now()))::float8 AS expires_in,
    {reservation_sql("l")}"""

_MINE = "(l.holder = excluded.holder AND l.instance = excluded.instance)"
# $1 election, $2 node id, $3 instance, $4 address, $5 ttl seconds, $6 channel,
# $7 takeover (the version the engine watched for one ttl, or ''), $8 min_term,
# $9 leaderd version, $10 lost_term, $11 priority, $12 health, $13 switchover. With it, in the same
# transaction: the member's heartbeat and, when a term began, its history record (records.py).
_ACQUIRE = f"""
WITH prev AS MATERIALIZED (
    SELECT holder, instance, term, expires_at FROM {{t}} WHERE election = $1
), cas AS (
    INSERT INTO {{t}} AS l (election, holder, instance, address, term, acquired_at, renewed_at,
                           expires_at, version)
    VALUES ($1, $2, $3, $4, GREATEST(1, $8::bigint), now(), now(),
            now() + make_interval(secs => $5::float8), 1)
    ON CONFLICT (election) DO UPDATE SET
        term = CASE WHEN {_MINE} AND l.expires_at > now()
                    THEN l.term ELSE GREATEST(l.term + 1, $8::bigint) END,
        acquired_at = CASE WHEN {_MINE} AND l.expires_at > now()
                           THEN l.acquired_at ELSE now() END,
        holder = excluded.holder, instance = excluded.instance, address = excluded.address,
        renewed_at = now(), expires_at = excluded.expires_at, version = l.version + 1,
        {CLEAR}
    WHERE (l.holder IS NULL AND NOT {reserved_sql("l", "excluded.holder")}) OR {_MINE}
       OR (l.holder IS NOT NULL AND l.expires_at <= now() AND {version_sql("l")} = $7::text)
    RETURNING {{cols}}
), {records.HEARD}, {records.HISTORY_CTES}, answer AS (
    SELECT *, CASE WHEN acquired_at = now()
        THEN pg_notify($6, term || ' acquired ' || $1)::text END AS notified
    FROM cas
    UNION ALL
    SELECT {{cols}}, NULL FROM {{t}} AS l WHERE election = $1 AND NOT EXISTS (SELECT FROM cas)
)
SELECT answer.*, {records.MEMBERS} AS members FROM answer
"""
_ACQUIRE_ARGS = {"e": "$1", "n": "$2", "i": "$3", "a": "$4", "ttl": "$5", "v": "$9", "lost": "$10",
                 "c": "true", "who": records.who("$11", "$12", "$13")}  # fmt: skip

_OBSERVE = f"SELECT {{cols}}, {records.MEMBERS} AS members FROM {{t}} AS l WHERE election = $1"
# $1 election, $2 node id, $3 instance, $4 address, $5 ttl, $6 leaderd version, $7 priority,
# $8 health, $9 switchover.
_OBSERVE_HEARD = f"WITH {records.HEARD}\n{_OBSERVE}"
_OBSERVE_ARGS = {"e": "$1", "n": "$2", "i": "$3", "a": "$4", "ttl": "$5", "v": "$6", "c": "false",
                 "who": records.who("$7", "$8", "$9")}  # fmt: skip

# $1 election, $2 node id, $3 instance, $4 term, $5 channel, $6 reserved for ('': none),
# $7 the reservation's seconds, $8 end reason, $9 and $11-$13 the heir (NULL: none): hand
# the lease to the campaigning member of another node id than $11 heard within $9 of its own
# ttl, of priority $12 or more and, if $13, healthy; the highest priority, then the freshest
# (docs/algorithm.md, "One-write hand-over" and "Who leads"), expiring its ttl after it was
# last heard; the member hears of it by the "granted" NOTIFY. $10 the version last answered
# ('': any): a late release after a renewal matches nothing.
_RELEASE = f"""
WITH heir AS MATERIALIZED (
    SELECT node_id, instance, address, ttl, heard_at FROM {{m}}
    WHERE $9::float8 IS NOT NULL AND $6::text = '' AND election = $1 AND campaigning
      AND node_id <> $11::text AND heard_at > now() - make_interval(secs => ttl * $9::float8)
      AND priority >= $12::integer AND (health = '' OR NOT $13::boolean)
      AND octet_length(node_id) + octet_length(address) + octet_length($1) < 4000
    ORDER BY priority DESC, heard_at DESC, node_id, instance LIMIT 1
), released AS (
    UPDATE {{t}} AS l SET holder = s.node_id, instance = coalesce(s.instance, ''),
        address = coalesce(s.address, ''), term = l.term + (s.node_id IS NOT NULL)::int,
        acquired_at = CASE WHEN s.node_id IS NULL THEN l.acquired_at ELSE now() END,
        renewed_at = now(), expires_at = coalesce(s.heard_at + make_interval(secs => s.ttl), now()),
        version = l.version + 1, {RESERVE}
    FROM (SELECT 1) AS one LEFT JOIN heir AS s ON true
    WHERE l.election = $1 AND l.holder = $2 AND l.instance = $3 AND l.term = $4
      AND ($10::text = '' OR {version_sql("l")} = $10::text)
    RETURNING l.election, $4::bigint AS term, l.term AS new_term, l.holder, l.instance,
        l.address, {version_sql("l")} AS version, s.ttl, s.heard_at
), {records.RELEASED}, {records.GRANTED}, {records.WITHDRAWN}
SELECT pg_notify($5, new_term || ' granted ' || json_build_object('election', election,
           'holder', holder, 'instance', instance, 'address', address, 'version', version,
           'ttl', ttl, 'heard_at', heard_at, 'acquired_at', now())::text)::text,
       pg_notify($5, new_term || ' acquired ' || election)::text
FROM released WHERE holder IS NOT NULL
UNION ALL
SELECT pg_notify($5, term || ' released ' || election)::text, NULL
FROM released WHERE holder IS NULL
"""

_DEFAULT_TIMEOUT = 5.0  # observe and release have no timeout argument
_MAX_POOL = 8
_CLOSED = (asyncpg.ConnectionDoesNotExistError, ConnectionResetError, BrokenPipeError)


class PostgresLeaseBackend(Backend):
    kind = "postgresql"
    capabilities = Capabilities()

    def __init__(self, settings: PgSettings) -> None:
        self._pg = settings
        names = {"t": settings.qualified_table, "cols": _LEASE_COLUMNS, **records.tables(settings)}
        self._sql_acquire = _ACQUIRE.format(**names, **_ACQUIRE_ARGS)
        self._sql_observe = _OBSERVE.format(**names, e="$1")
        self._sql_observe_heard = _OBSERVE_HEARD.format(**names, **_OBSERVE_ARGS)
        self._sql_release = _RELEASE.format(**names, e="$1", n="$2", i="$3", reason="$8")
        self._sql_history = records.HISTORY.format(**names)
        self._listener = Listener(settings, notify_channel(settings.table))
        self._pool = _Pool(settings, size=4, prepare=self._prepare)
        self._table_ready = False
        self._asker: dict[str, str] = {}  # the instance that asks, by election: whom a grant is for

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
        await self._request("creating the lease table", _DEFAULT_TIMEOUT, "")
        await self._listener.ready(self._pg.connect_timeout)

    async def observe(
        self, election: str, candidate: Candidate | None = None, ttl: float = 0.0
    ) -> Lease:
        doing, me = "reading the lease", candidate
        if me is None:
            rows = await self._request(doing, _DEFAULT_TIMEOUT, self._sql_observe, election)
        else:
            args = (election, me.node_id, me.instance, me.address, float(ttl), me.leaderd_version,
                    me.priority, me.health, me.switchover)  # fmt: skip
            rows = await self._request(doing, _DEFAULT_TIMEOUT, self._sql_observe_heard, *args)
        return self._saw(heard_in(_lease(election, rows[0] if rows else None, me, ttl), me))

    async def acquire_or_renew(self, ask: Ask) -> Lease:
        election, me = ask.election, ask.candidate
        self._asker[election] = me.instance
        args = (election, me.node_id, me.instance, me.address, float(ask.ttl),
                self._listener.channel, ask.takeover, ask.min_term, me.leaderd_version,
                ask.lost_term, me.priority, me.health, me.switchover)  # fmt: skip
        for _ in range(3):
            rows = await self._request("acquiring the lease", ask.timeout, self._sql_acquire, *args)
            if rows:
                return self._saw(heard_in(_lease(election, rows[0], me, ask.ttl, True), me))
            # A concurrent first INSERT won, after this statement's snapshot: read again.
        raise BackendUnavailable(f"acquiring the lease on {self.description}: lost three races")

    async def release(self, release: Release) -> None:
        me, to, heir = release.candidate, release.reserve_for, release.heir
        args = (release.election, me.node_id, me.instance, release.term, self._listener.channel)
        reservation = (to, float(release.ttl) if to else 0.0, end_text(release.reason, to))
        heir = heir or Heir("", heard_within_ttls=0.0)
        window = None if release.heir is None else heir.heard_within_ttls
        heir_args = (window, release.version, heir.releaser, heir.min_priority, heir.healthy)
        await self._request("releasing the lease", _DEFAULT_TIMEOUT, self._sql_release,
                            *args, *reservation, *heir_args)  # fmt: skip

    async def history(self, election: str, limit: int) -> list[Tenure]:
        doing = "reading the history"
        rows = await self._request(doing, _DEFAULT_TIMEOUT, self._sql_history, election, limit)
        return records.tenures(rows)

    async def wait_for_change(self, election: str, timeout: float) -> Grant | None:
        grant = await self._listener.wait(election, timeout)
        # Every listener hears every grant: only the heir is told it (others just wake).
        mine = grant is not None and grant.lease.instance == self._asker.get(election)
        return grant if mine else None

    async def close(self) -> None:
        await self._listener.stop()
        await self._pool.close()

    def _saw(self, lease: Lease) -> Lease:
        self._listener.saw(lease.election, lease.term, held=lease.holder is not None)
        return lease

    async def _request(self, doing: str, timeout: float, sql: str, *args: Any) -> list[Any]:
        """Run ``sql`` ("" for none) on a pooled connection, all within ``timeout``."""
        async with request(self._pg, doing, timeout):
            deadline = Deadline(timeout)
            try:
                return await self._attempt(deadline, sql, *args)
            except _CLOSED:
                # The server closed a pooled connection (restart, terminate): retry once on
                # a new one. Harmless even if the first one was applied: a repeated
                # acquisition is this instance's renewal, a repeated release a no-op.
                return await self._attempt(deadline, sql, *args)

    async def _attempt(self, deadline: Deadline, sql: str, *args: Any) -> list[Any]:
        async with self._pool.connection(deadline) as conn:
            rows: list[Any] = await conn.fetch(sql, *args) if sql else []
            return rows

    async def _prepare(self, conn: Any) -> None:
        """A new pooled connection: the tables (once); then the release, run once in a
        transaction rolled back, so that the server plans it now and not at a hand-over,
        whose one write it is (1-5 ms more there; conn.py keeps generic plans). Its term
        -1 matches no row."""
        if not self._table_ready:
            await ensure_table(self._pg, conn, _SCHEMA, _UPGRADE)
            await records.create(self._pg, conn)
            await fence.install(self._pg, conn)
            self._table_ready = True
        async with rolled_back(conn):
            await conn.fetch(self._sql_release, "", "", "", -1, self._listener.channel, "", 0.0,
                             EndReason.RELEASED.value, 0.5, "", "", 1, True)  # fmt: skip


class _Pool:
    """Idle connections and a limit on how many are busy; broken ones are dropped."""

    def __init__(
        self, settings: PgSettings, size: int, prepare: Callable[[Any], Awaitable[None]]
    ) -> None:
        self._pg = settings
        self.size = size
        self._prepare = prepare  # a new connection's set-up, before its first use
        self._busy = 0
        self._free = asyncio.Condition()
        self._idle: list[Any] = []
        self._closer = Closer()

    @contextlib.asynccontextmanager
    async def connection(self, deadline: Deadline) -> AsyncIterator[Any]:
        async with self._free:
            await self._free.wait_for(lambda: self._busy < self.size)
            self._busy += 1
        try:
            conn = self._take_idle() or await self._connect(deadline)
            try:
                yield conn
            except BaseException:
                self._closer.close(conn)  # after asyncpg's cancel of the running statement
                raise
            self._idle.append(conn)
        finally:
            self._busy -= 1
            async with self._free:
                self._free.notify()

    async def _connect(self, deadline: Deadline) -> Any:
        conn = await connect(self._pg, deadline.left())
        try:
            await self._prepare(conn)
        except BaseException:
            self._closer.close(conn)
            raise
        return conn

    def _take_idle(self) -> Any:
        while self._idle:
            conn = self._idle.pop()
            if not conn.is_closed():
                return conn
        return None

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        await asyncio.gather(*(close_quietly(c) for c in idle), self._closer.wait())


def _lease(
    election: str, row: Any, me: Candidate | None = None, ttl: float = 0.0, asked: bool = False
) -> Lease:
    """The lease a row shows (``asked``: ``me`` asked for it). An expired lease still names
    its holder (expires_in 0): it was never released, and only the takeover rule may end it."""
    if row is None:  # never held
        return Lease(election, None, "", 0, None, None)
    members = records.members(row["members"], me, ttl, asked)
    expires_in = None if row["holder"] is None else max(0.0, float(row["expires_in"]))
    return lease_from_row(election, row, expires_in, members)  # released: the term is kept
