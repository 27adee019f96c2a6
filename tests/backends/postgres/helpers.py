"""Shared helpers for the PostgreSQL backend tests."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg

from leaderd.backends import Backend, Candidate, backend_from_url
from tests.support.backend_calls import ask
from tests.support.pgserver import PgServer

SCHEMES = ("postgresql", "postgresql+advisory")


def unique(prefix: str = "e") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def url(pg: PgServer, scheme: str, **params: str) -> str:
    """A backend URL; the lease backend gets a table of its own per call site's choice."""
    return pg.dsn(scheme=scheme, **params)


@contextlib.asynccontextmanager
async def opened(backend_url: str, *elections: str) -> AsyncIterator[Backend]:
    backend = backend_from_url(backend_url)
    await backend.open(list(elections))
    try:
        yield backend
    finally:
        await backend.close()


@contextlib.asynccontextmanager
async def admin(pg: PgServer) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(pg.dsn())
    try:
        yield conn
    finally:
        await conn.close()


async def until(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll ``predicate`` every 10 ms for up to ``timeout`` seconds."""
    for _ in range(max(1, int(timeout / 0.01))):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return predicate()


def session_pid(backend: Any, election: str) -> int:
    """The server process of an advisory backend's lock session for ``election``."""
    return int(backend._sessions[election].conn.get_server_pid())


async def standby_session_pids(
    standby: Backend, election: str, me: Candidate, holder: str, ttl: float, timeout: float
) -> set[int]:
    """Five standby rounds that each wait 0.2 s for the lock and name ``holder``: the
    server processes their lock session ran on (one, when the session is kept)."""
    pids = set()
    for _ in range(5):
        lease = await ask(standby, election, me, ttl=ttl, timeout=timeout, wait=0.2)
        assert lease.holder == holder, lease
        pids.add(session_pid(standby, election))
    return pids


WAITING_FOR_A_LOCK = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event = 'advisory'"
)


async def lock_queue_empties(conn: asyncpg.Connection, application_name: str) -> bool:
    """Whether, within about 2 s, no session of ``application_name`` waits for an advisory
    lock (an abandoned wait leaves the queue only once the server cancels it)."""
    for _ in range(200):
        if await conn.fetchval(WAITING_FOR_A_LOCK, application_name) == 0:
            return True
        await asyncio.sleep(0.01)
    return False
