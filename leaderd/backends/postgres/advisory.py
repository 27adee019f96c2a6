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
leader's deadline. docs/postgresql.md has the whole argument. lock_session.py holds the
sessions and the wait for the lock.

Key: the first 8 bytes of sha256(b"leaderd:" + election, UTF-8) as a signed bigint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from ...clock import boottime
from ..asks import Ask, Release
from ..base import (
    Backend,
    BackendError,
    BackendUnavailable,
    Candidate,
    Capabilities,
    Capability,
    Lease,
)
from ..records import EndReason, Tenure, end_text
from . import advisory_sql as sql
from . import records
from .advisory_sql import advisory_key, session_settings
from .conn import connect, request, rolled_back
from .lock_session import LockSessions, Session, lock_budget
from .settings import PgSettings

__all__ = ["PostgresAdvisoryBackend", "advisory_key", "session_settings"]

_DEFAULT_TIMEOUT = 5.0
_PENDING_READS = 12  # about 0.15 s of re-reads while a new holder claims its row


class PostgresAdvisoryBackend(LockSessions, Backend):
    kind = "postgresql+advisory"
    capabilities = Capabilities(
        {
            Capability.TTL_LEFT: "an advisory lock held by a live session has no expiry time",
            Capability.GRANTS: "the lock is the lease: no row write can pass it to a standby",
        }
    )
    _IMMEDIATE = Capabilities(
        {
            **capabilities.lacks,
            Capability.TAKEOVER: "takeover=immediate: a session's end frees the lock",
            Capability.VERSIONED_RELEASE: "takeover=immediate: a release frees the lock "
            "whatever the row says; it runs on the lock's own session, after every renewal",
        }
    )

    def __init__(self, settings: PgSettings) -> None:
        if settings.takeover == "immediate":
            self.capabilities = self._IMMEDIATE
        super().__init__(settings)

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

    async def acquire_or_renew(self, ask: Ask) -> Lease:
        s, timeout = self._session(ask.election), ask.timeout
        if s.term is not None and s.conn is not None and not s.conn.is_closed():
            lease = await self._renew(s, ask, timeout)
        else:
            s.term = None
            # Not held, or the session ended under the holder: a new session may renew
            # (the row is still this process's and live) or acquire.
            campaign = functools.partial(self._campaign, s, ask, ask.wait, timeout)
            lease = await self._guard(s, "acquiring the lock", timeout, campaign)
        return self._saw(s, lease)

    async def release(self, release: Release) -> None:
        s, term, to = self._session(release.election), release.term, release.reserve_for
        if s.term is not None and s.term != term:
            return  # this session holds another term: the row cannot match
        holding, s.term = s.term is not None, None

        async def mark_then_unlock() -> None:
            conn = await self._connection(s, s.ttl, _DEFAULT_TIMEOUT)
            me = release.candidate
            args = (s.election, me.node_id, me.instance, term, self._listener.channel)
            reservation = (to, float(release.ttl) if to else 0.0)
            # Committed before the lock is freed.
            ended = end_text(release.reason, to)
            await conn.fetchval(self._sql["release"], *args, *reservation, ended, release.version)
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

    def _saw(self, s: Session, lease: Lease) -> Lease:
        s.known_term = max(s.known_term, lease.term)
        self._listener.saw(lease.election, lease.term, held=lease.holder is not None)
        return lease

    # -- the paths ---------------------------------------------------------------

    async def _renew(self, s: Session, ask: Ask, timeout: float) -> Lease:
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

    async def _campaign(self, s: Session, ask: Ask, wait: float, timeout: float) -> Lease:
        deadline = boottime() + timeout
        conn = await self._connection(s, ask.ttl, timeout)
        if not s.granted:
            if not s.planned:
                await self._plan(s, ask)
            lock_wait, grace = lock_budget(wait, deadline - boottime())
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

    async def _cas(self, s: Session, ask: Ask) -> Any:
        me = ask.candidate
        args = (s.election, s.key, me.node_id, me.instance, me.address, ask.ttl,
                self._listener.channel, ask.takeover, ask.min_term, s.started,
                me.leaderd_version, ask.lost_term, me.priority, me.health,
                me.switchover)  # fmt: skip
        return await s.cas.fetchrow(*args)

    async def _plan(self, s: Session, ask: Ask) -> None:
        """Run the claim, the reads and the release once, in a transaction rolled back,
        before the session first waits in the lock queue. The server plans them now (the
        session's plan_cache_mode keeps generic plans, conn.py) and loads their catalog
        caches: the claim after a grant and the release took 2-8 ms more on the hand-over's
        path without it. Nothing it does outlives the rollback: it takes no advisory lock
        (the claim only reads pg_locks) and the release names term -1, which no row has."""
        me, channel = ask.candidate, self._listener.channel
        async with rolled_back(s.conn):
            await self._cas(s, dataclasses.replace(ask, lost_term=0))
            await s.observe.fetchrow(s.election, s.key)
            await s.observe_heard.fetchrow(s.election, s.key, me.node_id, me.instance,
                                           me.address, ask.ttl, me.leaderd_version, 0,
                                           me.priority, me.health, me.switchover)  # fmt: skip
            await s.conn.fetchval(self._sql["release"], s.election, me.node_id, me.instance, -1,
                                  channel, "", 0.0, EndReason.RELEASED.value, "")  # fmt: skip
        s.planned = True

    def _claimed(self, s: Session, ask: Ask, row: Any, sent: float) -> Lease:
        """The answer of the CAS statement, as this session's state and a lease."""
        self._check_pid(s, s.conn, row["session_pid"])
        if not row["locked"]:
            s.term, s.stale = None, True  # only a pooler can do this; fail, never claim
            raise BackendUnavailable(
                f"renewing the lock on {self.description}: this session no longer holds it"
            )
        lease = sql.row_lease(s.election, row, False, ask.candidate, ask.ttl, asked=True)
        if lease.held_by(ask.candidate):
            s.term, s.kept_at, s.granted = lease.term, sent, False
            return dataclasses.replace(lease, expires_in=None)  # no expiry while it lives
        if s.term is not None:
            # The row is no longer this process's (edited by hand): not held, for sure. The
            # lock goes back at the next call, once the engine has heard this answer.
            s.term, s.stale = None, True
        return lease  # an unreleased holder, waited out with the lock granted

    async def _read(
        self,
        s: Session,
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
                heard = (me.node_id, me.instance, me.address, ttl, me.leaderd_version, lost_term,
                         me.priority, me.health, me.switchover)  # fmt: skip
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
