"""postgresql+advisory:// — a session advisory lock per election, held by a live session.

Each election has one dedicated connection (its lock session). A standby blocks in
``pg_advisory_lock(key)`` (bounded by ``lock_timeout`` ≈ ``wait``), so a released lock
passes on within a round trip; once granted, the same session claims the companion row
with the lease backend's rules (advisory_sql.CAS), so ``term`` is a real fencing token.
The holder proves its session alive, and still holding the lock, with that same statement
at every renewal; it moves the row's ``expires_at`` and ``version``.

The session is configured so that the server never ends it — and so never frees the lock
— before the old leader's local deadline: ``idle_session_timeout``, ``tcp_keepalives_*``
and ``tcp_user_timeout`` are all at least one ``ttl`` after the last request. When the
server ends a session anyway (terminate, restart), a successor granted the lock claims an
unreleased row only once it is over on the server's clock *and* the engine names the
version it watched for one ttl (``takeover=wait``, docs/algorithm.md), which is after the old
leader's deadline. docs/postgresql.md has the whole argument.

Key: the first 8 bytes of sha256(b"leaderd:" + election, UTF-8) as a signed bigint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg

from ..clock import boottime
from . import advisory_sql as sql
from . import pg_records as records
from .advisory_sql import advisory_key, session_settings
from .base import Backend, BackendError, BackendFatal, BackendUnavailable, Candidate, Lease
from .pgconn import Closer, connect, ensure_table, quote_literal_ms, request, rolled_back
from .pglisten import Listener, notify_channel
from .pgsettings import PgSettings
from .records import EndReason, Tenure

__all__ = ["PostgresAdvisoryBackend", "advisory_key", "session_settings"]

_DEFAULT_TIMEOUT = 5.0
_DEFAULT_TTL = 15.0
_PENDING_READS = 12  # about 0.15 s of re-reads while a new holder claims its row
# How long past its lock_timeout a lock wait may take to answer before it is given up: the
# server's timeout, not ours, ends a quiet round, so that the session is kept.
_LOCK_ANSWER_GRACE = 0.25
# How long a lock wait cancelled over the LISTEN connection may take to end before its
# session is closed instead.
_CANCEL_TIMEOUT = 0.1
_POOLER = (
    "the advisory backend needs a direct session to PostgreSQL, but the server process "
    "changed under it (pid {a} then {b}): a transaction-mode pooler such as PgBouncer is "
    "in the way; point the URL at PostgreSQL itself"
)


@dataclasses.dataclass
class _Session:
    """One election's dedicated connection and what this node holds through it."""

    election: str
    key: int
    conn: Any = None
    ttl: float = _DEFAULT_TTL
    term: int | None = None  # set while this session holds the lock and the row
    kept_at: float = -math.inf  # CLOCK_BOOTTIME send time of the last claim or renewal that held
    granted: bool = False  # the lock is granted, the row not claimed: an unreleased holder
    stale: bool = False  # close it before the next use
    known_term: int = 0  # the highest term any answer showed
    started: Any = None  # the session's backend_start (with its pid, who it is)
    # The claim and the reads, prepared when the session opens and planned before its first
    # lock wait (_plan): a standby granted the lock only executes the claim.
    cas: Any = None
    observe: Any = None
    observe_heard: Any = None
    planned: bool = False  # each statement has run once (rolled back): its plan is cached


@dataclasses.dataclass(frozen=True)
class _Ask:
    """What one acquire_or_renew asks for."""

    candidate: Candidate
    ttl: float
    takeover: str
    min_term: int
    lost_term: int


class PostgresAdvisoryBackend(Backend):
    kind = "postgresql+advisory"

    def __init__(self, settings: PgSettings) -> None:
        self._pg = settings
        tables = records.tables(settings)
        self._sql = sql.statements(settings.qualified_table, tables, settings.takeover)
        self._sessions: dict[str, _Session] = {}
        self._listener = Listener(settings, notify_channel(settings.table))
        self._table_ready = False
        self._closer = Closer()

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
        conn = await connect(self._pg, self._pg.connect_timeout)
        try:
            async with request(self._pg, "creating the table", _DEFAULT_TIMEOUT):
                await self._prepare(conn)
        finally:
            conn.terminate()
        await self._listener.ready(self._pg.connect_timeout)

    async def observe(
        self, election: str, candidate: Candidate | None = None, ttl: float = 0.0
    ) -> Lease:
        s = self._session(election)
        if s.granted:
            self._drop(s)  # cooling down: a lock waiting to be claimed goes back
        read = functools.partial(self._read, s, _DEFAULT_TIMEOUT, candidate, ttl)
        return self._saw(s, await self._guard(s, "reading the lock", _DEFAULT_TIMEOUT, read))

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
        s = self._session(election)
        ask = _Ask(candidate, float(ttl), takeover, min_term, lost_term)
        if s.term is not None and s.conn is not None and not s.conn.is_closed():
            lease = await self._renew(s, ask, timeout)
        else:
            s.term = None
            # Not held, or the session ended under the holder: a new session may renew
            # (the row is still this process's and live) or acquire.
            campaign = functools.partial(self._campaign, s, ask, wait, timeout)
            lease = await self._guard(s, "acquiring the lock", timeout, campaign)
        return self._saw(s, lease)

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
        s = self._session(election)
        if s.term is not None and s.term != term:
            return  # this session holds another term: the row cannot match
        holding, s.term = s.term is not None, None

        async def mark_then_unlock() -> None:
            conn = await self._connection(s, s.ttl, _DEFAULT_TIMEOUT)
            me = candidate
            args = (s.election, me.node_id, me.instance, term, self._listener.channel)
            reservation = (reserve_for, float(ttl) if reserve_for else 0.0)
            release = self._sql["release"]
            # Committed before the lock is freed.
            await conn.fetchval(release, *args, *reservation, reason.value, version)
            if holding:
                await conn.fetchval(sql.UNLOCK, s.key)

        # On failure the session is closed, which frees the lock for sure.
        await self._guard(s, "releasing the lock", _DEFAULT_TIMEOUT, mark_then_unlock)

    async def history(self, election: str, limit: int) -> list[Tenure]:
        s = self._session(election)

        async def read() -> list[Tenure]:
            conn = await self._connection(s, s.ttl, _DEFAULT_TIMEOUT)
            return records.tenures(await conn.fetch(self._sql["history"], election, limit))

        return list(await self._guard(s, "reading the history", _DEFAULT_TIMEOUT, read))

    async def wait_for_change(self, election: str, timeout: float) -> None:
        await self._listener.wait(election, timeout)

    async def close(self) -> None:
        for s in self._sessions.values():
            s.term = None
            self._drop(s)
        await self._listener.stop()
        await self._closer.wait()

    def _saw(self, s: _Session, lease: Lease) -> Lease:
        s.known_term = max(s.known_term, lease.term)
        self._listener.saw(lease.election, lease.term, held=lease.holder is not None)
        return lease

    # -- the paths ---------------------------------------------------------------

    async def _renew(self, s: _Session, ask: _Ask, timeout: float) -> Lease:
        """The holder's keepalive. A failure is in doubt: the lock may still be this
        session's, and the engine leads until its deadline (at most one ttl after the last
        renewal was sent), so the session is kept, and retried, until then; closing it
        sooner could free the lock under a node that still answers "leader"."""
        sent = boottime()
        try:
            async with request(self._pg, "renewing the lock", timeout):
                return self._claimed(s, ask, await self._cas(s, ask), sent)
        except BackendError:
            if boottime() >= s.kept_at + s.ttl:
                s.term, s.stale = None, True  # the engine's deadline has passed: let go
            raise

    async def _campaign(self, s: _Session, ask: _Ask, wait: float, timeout: float) -> Lease:
        deadline = boottime() + timeout
        conn = await self._connection(s, ask.ttl, timeout)
        if not s.granted:
            if not s.planned:
                await self._plan(s, ask)
            lock_wait, grace = _lock_budget(wait, deadline - boottime())
            known = max(s.known_term, ask.min_term - 1)  # min_term: the engine's high-water + 1
            granted = await self._lock(s, conn, lock_wait, grace, known)
            if not granted:
                lease = await self._read(s, timeout, ask.candidate, ask.ttl, ask.lost_term)
                if lease.holder is None:  # released meanwhile: the lock is free, try it
                    conn = await self._connection(s, ask.ttl, timeout)
                    granted = await self._lock(s, conn, 0.0, 0.0, known)
                if not granted:
                    if lease.held_by(ask.candidate):  # never "held" without the lock
                        raise BackendUnavailable(
                            f"acquiring the lock on {self.description}: this daemon's lease "
                            "lasts, but another session holds the lock (an earlier one of "
                            "this daemon, or a standby about to give it back)"
                        )
                    return lease
            s.granted = True
        sent = boottime()
        lease = self._claimed(s, ask, await self._cas(s, ask), sent)
        lasts = lease.holder is not None and not lease.expired
        if s.granted and (lasts or lease.reserved_against(ask.candidate)):
            # Another holder's lease lasts on the server's clock: give the lock back, so
            # that holder, if alive, renews through a new session (after a server restart)
            # instead of being waited out. It is kept only once that lease is over, until
            # the engine names the version it watched (the takeover rule). Likewise a lease
            # reserved for another node: the lock goes back, so that node is granted it.
            await s.conn.fetchval(sql.UNLOCK, s.key)
            s.granted = False
        return lease

    async def _cas(self, s: _Session, ask: _Ask) -> Any:
        me = ask.candidate
        args = (s.election, s.key, me.node_id, me.instance, me.address, ask.ttl,
                self._listener.channel, ask.takeover, ask.min_term, s.started,
                me.leaderd_version, ask.lost_term)  # fmt: skip
        return await s.cas.fetchrow(*args)

    async def _plan(self, s: _Session, ask: _Ask) -> None:
        """Run the claim, the reads and the release once, in a transaction rolled back,
        before the session first waits in the lock queue. The server plans them now (the
        session's plan_cache_mode keeps generic plans, pgconn.py) and loads their catalog
        caches: the claim after a grant and the release took 2-8 ms more on the hand-over's
        path without it. Nothing it does outlives the rollback: it takes no advisory lock
        (the claim only reads pg_locks) and the release names term -1, which no row has."""
        me, channel = ask.candidate, self._listener.channel
        async with rolled_back(s.conn):
            await self._cas(s, dataclasses.replace(ask, lost_term=0))
            await s.observe.fetchrow(s.election, s.key)
            await s.observe_heard.fetchrow(s.election, s.key, me.node_id, me.instance,
                                           me.address, ask.ttl, me.leaderd_version, 0)  # fmt: skip
            await s.conn.fetchval(self._sql["release"], s.election, me.node_id, me.instance, -1,
                                  channel, "", 0.0, EndReason.RELEASED.value, "")  # fmt: skip
        s.planned = True

    def _claimed(self, s: _Session, ask: _Ask, row: Any, sent: float) -> Lease:
        """The answer of the CAS statement, as this session's state and a lease."""
        self._check_pid(s, s.conn, row["session_pid"])
        if not row["locked"]:
            s.term, s.stale = None, True  # only a pooler can do this; fail, never claim
            raise BackendUnavailable(
                f"renewing the lock on {self.description}: this session no longer holds it"
            )
        lease = sql.row_lease(s.election, row, False, ask.candidate, ask.ttl)
        if lease.held_by(ask.candidate):
            s.term, s.kept_at, s.granted = lease.term, sent, False
            return dataclasses.replace(lease, expires_in=None)  # no expiry while it lives
        if s.term is not None:
            # The row is no longer this process's (edited by hand): not held, for sure. The
            # lock goes back at the next call, once the engine has heard this answer.
            s.term, s.stale = None, True
        return lease  # an unreleased holder, waited out with the lock granted

    async def _lock(
        self, s: _Session, conn: Any, lock_wait: float, grace: float, known: int
    ) -> bool:
        """Take the lock at once, or block for it up to ``lock_wait`` (the server's
        lock_timeout, whose answer is waited for ``grace`` more seconds); give up early when
        another node announces it acquired a term above ``known``, so this follower names
        the new leader at once (a late NOTIFY of a term it knows does not count)."""
        if lock_wait < 0.001:
            row = await conn.fetchrow(sql.TRY_LOCK, s.key)
            self._check_pid(s, conn, row["pid"])
            return bool(row["granted"])
        lock = asyncio.ensure_future(conn.fetchrow(sql.LOCK, s.key, quote_literal_ms(lock_wait)))
        news = asyncio.ensure_future(self._listener.acquired(s.election, known, lock_wait + grace))
        try:
            await asyncio.wait({lock, news}, return_when=asyncio.FIRST_COMPLETED)
            if not lock.done():  # news of a new holder, or the answer is late
                await self._cancel_wait(s, conn, lock)
        finally:
            news.cancel()
            if not lock.done():
                # Ending the session cancels the wait, and frees a lock granted meanwhile.
                lock.cancel()
                self._drop(s)
                await asyncio.gather(lock, return_exceptions=True)
        if lock.cancelled():
            return False
        try:
            row = lock.result()
        except asyncpg.LockNotAvailableError:
            return False
        except asyncpg.QueryCanceledError:
            # The lock may have been granted just before the cancel struck: the statement
            # ends with an error, yet the session keeps the lock. No claim follows, and a
            # lock held twice would outlive a release's single unlock; should this fail, the
            # session is closed (_guard), which frees it as well.
            await conn.fetchval(sql.UNLOCK_ALL)
            return False
        self._check_pid(s, conn, row["pid"])
        return True

    async def _cancel_wait(self, s: _Session, conn: Any, lock: asyncio.Future[Any]) -> None:
        """End a lock wait on its own session, which is kept with its planned statements:
        the LISTEN connection cancels it. Closing the session instead costs the server a
        process for asyncpg's CancelRequest and the standby a new session (a new process)
        for its next read, both while the new holder claims its row on the same cores."""
        if await self._listener.cancel(conn.get_server_pid(), _CANCEL_TIMEOUT):
            await asyncio.wait({lock}, timeout=_CANCEL_TIMEOUT)

    async def _read(
        self,
        s: _Session,
        timeout: float,
        me: Candidate | None = None,
        ttl: float = 0.0,
        lost_term: int = 0,
    ) -> Lease:
        """The lease as the row and the lock show it (``me``: register that member). A
        session that holds the lock but is not the row's is a successor about to claim it
        (one round trip): read again shortly; with takeover=wait it may also be waiting out
        the row's holder."""
        await self._connection(s, s.ttl, timeout)
        lease = None
        for attempt in range(_PENDING_READS):
            if me is None:
                row = await s.observe.fetchrow(s.election, s.key)
            else:
                heard = (me.node_id, me.instance, me.address, ttl, me.leaderd_version, lost_term)
                row = await s.observe_heard.fetchrow(s.election, s.key, *heard)
            lease = self._judge(s.election, row, me, ttl)
            if lease is not None:
                return lease
            await asyncio.sleep(0.002 * (attempt + 1))
        return sql.free_lease(s.election, row, me, ttl)

    def _judge(self, election: str, row: Any, me: Candidate | None, ttl: float) -> Lease | None:
        """What an observer may say from one read; None while a claim is under way."""
        locked, recorded = row["lock_pid"] is not None, row["recorded"]
        if row["holder"] is None:  # released (its session may be freeing the lock)
            return None if locked and not recorded else sql.free_lease(election, row, me, ttl)
        if recorded:  # the holder's own session holds the lock: live, no expiry
            return sql.row_lease(election, row, True, me, ttl)
        if self._pg.takeover == "wait":  # unreleased: its lease lasts until expires_at
            return sql.row_lease(election, row, False, me, ttl)
        return None if locked else sql.free_lease(election, row, me, ttl)

    # -- the lock session ----------------------------------------------------------

    async def _guard(
        self, s: _Session, doing: str, timeout: float, op: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Run ``op`` in the error boundary; on any failure of a session that claims
        nothing, close it (it may hold a lock granted at the last moment)."""
        try:
            async with request(self._pg, doing, timeout):
                return await op()
        except BaseException:
            if s.term is None:
                self._drop(s)
            raise

    async def _connection(self, s: _Session, ttl: float, timeout: float) -> Any:
        if s.stale or (s.conn is not None and s.conn.is_closed()):
            self._drop(s)
        if s.conn is None:
            await self._open_session(s, ttl, timeout)
        elif s.ttl != ttl:
            settings = session_settings(ttl)
            calls = (f"set_config('{k}', ${i}, false)" for i, k in enumerate(settings, 1))
            await s.conn.execute("SELECT " + ", ".join(calls), *settings.values())
            s.ttl = ttl
        return s.conn

    async def _open_session(self, s: _Session, ttl: float, timeout: float) -> None:
        conn = await connect(self._pg, timeout, session_settings(ttl))
        try:
            if not self._table_ready:
                await self._prepare(conn)
            started = (await conn.fetchrow(sql.SESSION))["backend_start"]
            cas, observe = (
                await conn.prepare(self._sql["cas"]),
                await conn.prepare(self._sql["observe"]),
            )
            heard = await conn.prepare(self._sql["observe_heard"])
        except BaseException:
            self._closer.close(conn)
            raise
        s.conn, s.ttl, s.started, s.cas, s.observe = conn, ttl, started, cas, observe
        s.observe_heard, s.planned = heard, False
        conn.add_termination_listener(lambda c: self._on_closed(s, c))

    async def _prepare(self, conn: Any) -> None:
        if conn.get_server_version().major < 14:
            raise BackendFatal(
                f"{self.description}: the advisory backend needs PostgreSQL 14 or later "
                "(idle_session_timeout)"
            )
        await ensure_table(self._pg, conn, sql.SCHEMA, sql.UPGRADE)
        await records.create(self._pg, conn)
        self._table_ready = True

    def _check_pid(self, s: _Session, conn: Any, pid: int) -> None:
        if pid != conn.get_server_pid():
            s.term, s.stale = None, True
            raise BackendFatal(_POOLER.format(a=conn.get_server_pid(), b=pid))

    def _on_closed(self, s: _Session, conn: Any) -> None:
        if s.conn is not conn:  # we closed it ourselves
            return
        s.conn, s.granted, s.term = None, False, None
        self._listener.wake(s.election)  # the engine asks again now, on a new session

    def _drop(self, s: _Session) -> None:
        """Forget the session's connection and close it in the background: asyncpg first
        cancels a statement still running (a blocked pg_advisory_lock), then terminates."""
        conn, s.conn, s.stale, s.granted = s.conn, None, False, False
        self._closer.close(conn)

    def _session(self, election: str) -> _Session:
        s = self._sessions.get(election)
        if s is None:
            s = self._sessions[election] = _Session(election, advisory_key(election))
        return s


def _lock_budget(wait: float, left: float) -> tuple[float, float]:
    """(lock_timeout, grace for its answer) for a lock wait with ``left`` seconds of the
    request to go. Up to a second stays for the claim after a grant; half of the rest for
    the cancel and the read after a wait given up on: a server whose timers run late (its
    clock stepped back) answers lock_timeout only that much later."""
    lock_wait = max(0.0, min(wait, left - min(1.0, left / 2)))
    return lock_wait, min(_LOCK_ANSWER_GRACE, (left - lock_wait) / 2)
