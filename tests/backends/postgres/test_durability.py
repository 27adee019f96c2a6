"""Durable terms (docs/postgresql.md): lease statements commit with synchronous_commit at least
"on" whatever the server's default, and a read-only or recovering server is refused."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from leaderd.backends import Backend, BackendUnavailable, Candidate, backend_from_url
from tests.backends.postgres.helpers import opened, unique
from tests.support.backend_calls import ask, release
from tests.support.pgserver import PASSWORD, PASSWORD_USER, PgServer, PgServerError

pytestmark = pytest.mark.postgres

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
C = Candidate("node-c", "10.0.0.3:80")


@pytest.fixture(scope="module")
def async_commit_server() -> Iterator[PgServer]:
    """A server tuned the common way that loses acknowledged commits in a crash. Its WAL
    writer flushes every 10 s, so a crash loses every asynchronous commit of the last few
    seconds, deterministically."""
    server = PgServer(config="synchronous_commit = off\nwal_writer_delay = 10000ms")
    try:
        yield server
    finally:
        server.cleanup()


async def test_acknowledged_terms_survive_a_crash_of_a_server_that_commits_asynchronously(
    async_commit_server: PgServer, scheme: str
) -> None:
    server, e = async_commit_server, unique()
    u = server.dsn(scheme=scheme, table=unique("t"))
    term = 0
    async with opened(u, e) as a, opened(u, e) as b:
        await asyncio.to_thread(server.psql, "CHECKPOINT")  # the new table is on disk
        for i in range(10):  # ten acquisitions, each one acknowledged to a "daemon"
            backend, me = (a, A) if i % 2 == 0 else (b, B)
            lease = await ask(backend, e, me, ttl=15, timeout=5)
            assert lease.held_by(me) and lease.term == term + 1
            term = lease.term
            await release(backend, e, me, term)
    await asyncio.to_thread(server.stop, "immediate")  # a crash: no shutdown checkpoint
    await asyncio.to_thread(server.start)
    async with opened(u, e) as c:
        seen = await c.observe(e)
        assert seen.term == term, f"the crash lost acknowledged terms: {seen.term} < {term}"
        assert (await ask(c, e, C, ttl=15, timeout=5)).term == term + 1


def _session(backend: Backend, election: str) -> Any:
    """The connection the backend sends lease statements on."""
    if backend.kind == "postgresql":
        return backend._pool._idle[0]  # type: ignore[attr-defined]
    return backend._sessions[election].conn  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("default", "used"),
    [("off", "on"), ("local", "on"), ("remote_write", "on"), ("on", "on"),
     ("remote_apply", "remote_apply")],
)  # fmt: skip
async def test_lease_statements_commit_at_least_synchronously(
    pg_server: PgServer, scheme: str, default: str, used: str
) -> None:
    # A setting in the URL reaches the session as a role's or database's default would.
    u, e = pg_server.dsn(scheme=scheme, table=unique("t"), synchronous_commit=default), unique()
    async with opened(u, e) as a:
        assert (await ask(a, e, A, ttl=15, timeout=5)).held_by(A)
        assert await _session(a, e).fetchval("SHOW synchronous_commit") == used


async def _refused(backend_url: str, e: str, why: str) -> None:
    backend = backend_from_url(backend_url)
    try:
        for request in (
            lambda: backend.open([e]),
            lambda: backend.observe(e),
            lambda: ask(backend, e, A, ttl=15, timeout=5),
        ):
            with pytest.raises(BackendUnavailable, match=why) as info:
                await request()
            message = str(info.value)
            assert "\n" not in message and PASSWORD not in message, message
    finally:
        await backend.close()


async def test_a_read_only_database_is_refused(pg_server: PgServer, scheme: str) -> None:
    db, e, table = unique("ro"), unique(), unique("t")
    await asyncio.to_thread(pg_server.psql, f"CREATE DATABASE {db}")
    try:
        u = pg_server.dsn(PASSWORD_USER, PASSWORD, database=db, scheme=scheme, table=table)
        async with opened(u, e) as a:  # the table and a lease exist: reads would work
            await ask(a, e, A, ttl=15, timeout=5)
        await asyncio.to_thread(
            pg_server.psql, f"ALTER DATABASE {db} SET default_transaction_read_only = on"
        )
        await _refused(u, e, r"is read-only \(default_transaction_read_only is on\)")
    finally:
        await asyncio.to_thread(pg_server.psql, f"DROP DATABASE {db} WITH (FORCE)")


async def test_a_server_turned_read_only_under_open_sessions_is_refused(
    pg: PgServer, scheme: str
) -> None:
    u, e = pg.dsn(scheme=scheme, table=unique("t")), unique()
    async with opened(u, e) as a:
        assert (await ask(a, e, A, ttl=15, timeout=5)).held_by(A)
        await release(a, e, A, (await a.observe(e)).term)
        await asyncio.to_thread(pg.psql, "ALTER SYSTEM SET default_transaction_read_only = on")
        await asyncio.to_thread(pg.psql, "SELECT pg_reload_conf()")
        try:
            await asyncio.sleep(0.3)  # every backend has reloaded its configuration
            with pytest.raises(BackendUnavailable, match="the server is read-only"):
                await ask(a, e, A, ttl=15, timeout=5)
        finally:
            await asyncio.to_thread(pg.psql, "ALTER SYSTEM RESET default_transaction_read_only")
            await asyncio.to_thread(pg.psql, "SELECT pg_reload_conf()")


@pytest.fixture(scope="module")
def standby(pg_server: PgServer) -> Iterator[PgServer]:
    """A real hot standby of the session's server (pg_basebackup, streaming)."""
    server = PgServer(primary=pg_server)
    try:
        yield server
    finally:
        server.cleanup()


async def test_a_standby_in_recovery_is_refused(
    pg_server: PgServer, standby: PgServer, scheme: str
) -> None:
    e, table = unique(), unique("t")
    async with opened(pg_server.dsn(scheme=scheme, table=table), e) as a:
        lease = await ask(a, e, A, ttl=15, timeout=5)
    for _ in range(600):  # replicated: a follower reading the standby would see it
        with contextlib.suppress(PgServerError):  # the table itself not replayed yet
            if standby.psql(f"SELECT count(*) FROM {table}") == "1":
                break
        await asyncio.sleep(0.05)
    assert lease.held_by(A)
    await _refused(standby.dsn(scheme=scheme, table=table), e, "is a standby in recovery")
