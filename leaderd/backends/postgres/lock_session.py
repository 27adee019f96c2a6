"""The advisory backend's lock sessions: one dedicated connection per election, opened with
settings that keep the server from ending it before the holder's deadline, and the wait for
the lock on it (advisory.py claims and renews through it; docs/postgresql.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from ..base import BackendFatal
from . import advisory_sql as sql
from . import records
from .advisory_sql import advisory_key, session_settings
from .conn import Closer, connect, ensure_table, quote_literal_ms, request
from .listen import Listener, notify_channel
from .settings import PgSettings

_DEFAULT_TTL = 15.0
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
class Session:
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


class LockSessions:
    """The lock session of each election, and how a lock is waited for on one."""

    def __init__(self, settings: PgSettings) -> None:
        self._pg = settings
        tables = records.tables(settings)
        self._sql = sql.statements(settings.qualified_table, tables, settings.takeover)
        self._sessions: dict[str, Session] = {}
        self._listener = Listener(settings, notify_channel(settings.table))
        self._table_ready = False
        self._closer = Closer()

    async def _lock(
        self, s: Session, conn: Any, lock_wait: float, grace: float, known: int
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

    async def _cancel_wait(self, s: Session, conn: Any, lock: asyncio.Future[Any]) -> None:
        """End a lock wait on its own session, which is kept with its planned statements:
        the LISTEN connection cancels it. Closing the session instead costs the server a
        process for asyncpg's CancelRequest and the standby a new session (a new process)
        for its next read, both while the new holder claims its row on the same cores."""
        if await self._listener.cancel(conn.get_server_pid(), _CANCEL_TIMEOUT):
            await asyncio.wait({lock}, timeout=_CANCEL_TIMEOUT)

    async def _guard(
        self, s: Session, doing: str, timeout: float, op: Callable[[], Awaitable[Any]]
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

    async def _connection(self, s: Session, ttl: float, timeout: float) -> Any:
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

    async def _open_session(self, s: Session, ttl: float, timeout: float) -> None:
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
                f"{self._pg.description}: the advisory backend needs PostgreSQL 14 or later "
                "(idle_session_timeout)"
            )
        await ensure_table(self._pg, conn, sql.SCHEMA, sql.UPGRADE)
        await records.create(self._pg, conn)
        self._table_ready = True

    def _check_pid(self, s: Session, conn: Any, pid: int) -> None:
        if pid != conn.get_server_pid():
            s.term, s.stale = None, True
            raise BackendFatal(_POOLER.format(a=conn.get_server_pid(), b=pid))

    def _on_closed(self, s: Session, conn: Any) -> None:
        if s.conn is not conn:  # we closed it ourselves
            return
        s.conn, s.granted, s.term = None, False, None
        self._listener.wake(s.election)  # the engine asks again now, on a new session

    def _drop(self, s: Session) -> None:
        """Forget the session's connection and close it in the background: asyncpg first
        cancels a statement still running (a blocked pg_advisory_lock), then terminates."""
        conn, s.conn, s.stale, s.granted = s.conn, None, False, False
        self._closer.close(conn)

    def _session(self, election: str) -> Session:
        s = self._sessions.get(election)
        if s is None:
            s = self._sessions[election] = Session(election, advisory_key(election))
        return s


def lock_budget(wait: float, left: float) -> tuple[float, float]:
    """(lock_timeout, grace for its answer) for a lock wait with ``left`` seconds of the
    request to go. Up to a second stays for the claim after a grant; half of the rest for
    the cancel and the read after a wait given up on: a server whose timers run late (its
    clock stepped back) answers lock_timeout only that much later."""
    lock_wait = max(0.0, min(wait, left - min(1.0, left / 2)))
    return lock_wait, min(_LOCK_ANSWER_GRACE, (left - lock_wait) / 2)
