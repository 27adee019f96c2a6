"""postgresql:// specifics: hung statements, the server's clock, LISTEN fallback."""

from __future__ import annotations

import asyncio

import pytest

from leaderd.backends import BackendUnavailable, Candidate
from leaderd.backends.postgres.lease import PostgresLeaseBackend
from tests.backends.postgres.helpers import admin, opened, unique, until
from tests.support.backend_calls import ask, release
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.postgres

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")


async def test_a_hung_statement_gives_up_within_the_timeout(pg_server: PgServer) -> None:
    table, e = unique("t"), unique()
    async with opened(pg_server.dsn(table=table), e) as a, admin(pg_server) as other:
        first = await ask(a, e, A, ttl=15, timeout=5)
        tx = other.transaction()
        await tx.start()
        await other.execute(f"SELECT * FROM {table} WHERE election = $1 FOR UPDATE", e)
        try:
            # The request's own bound fired, while the row was still locked.
            with pytest.raises(BackendUnavailable, match=r"timed out after 0\.5s"):
                await ask(a, e, A, ttl=15, timeout=0.5)
            # asyncpg cancelled the statement on the server: it no longer waits for the row.
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            for _ in range(50):
                if await other.fetchval(waiting) == 0:
                    break
                await asyncio.sleep(0.02)
            assert await other.fetchval(waiting) == 0
        finally:
            await tx.rollback()
        again = await ask(a, e, A, ttl=15, timeout=5)
        assert again.held_by(A) and again.term == first.term


async def test_expires_in_comes_from_the_servers_clock(pg_server: PgServer) -> None:
    u, e = pg_server.dsn(table=unique("t")), unique()
    async with opened(u, e) as a, opened(u, e) as b:
        mine = await ask(a, e, A, ttl=2, timeout=5)
        assert mine.expires_in is not None and 1.9 < mine.expires_in <= 2.0
        await asyncio.sleep(0.5)
        seen = await ask(b, e, B, ttl=2, timeout=5)
        assert seen.holder == A.node_id
        assert seen.expires_in is not None and 1.3 < seen.expires_in < 1.6
        await asyncio.sleep(seen.expires_in + 0.05)  # what a follower does
        expired = await b.observe(e)  # over on the server's clock, still named
        assert expired.expired and expired.holder == A.node_id and expired.version
        # The engine names the version it watched for one ttl (docs/algorithm.md).
        taken = await ask(b, e, B, ttl=2, timeout=5, takeover=expired.version)
        assert taken.held_by(B) and taken.term == mine.term + 1


async def test_lost_listen_connection_falls_back_to_polling(pg_server: PgServer) -> None:
    u, e = pg_server.dsn(table=unique("t")), unique()
    async with opened(u, e) as a, opened(u, e) as b, admin(pg_server) as other:
        assert isinstance(b, PostgresLeaseBackend) and b.listening
        lease = await ask(a, e, A, ttl=15, timeout=5)
        await b.observe(e)
        await other.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'"
        )
        assert await until(lambda: not b.listening, 2)
        # It comes back (backoff from 0.1 s); until then wait_for_change is a plain sleep.
        assert await until(lambda: b.listening, 2)
        await b.observe(e)
        # Woken by the NOTIFY again: without LISTEN this wait is a plain hour's sleep.
        task = asyncio.create_task(b.wait_for_change(e, 3600))
        await asyncio.sleep(0.1)
        assert not task.done()
        await release(a, e, A, lease.term)
        await asyncio.wait_for(task, 10)


async def test_a_terminated_request_connection_is_replaced_transparently(
    pg_server: PgServer,
) -> None:
    u, e = pg_server.dsn(table=unique("t"), application_name="leaderd-term-test"), unique()
    async with opened(u, e) as a, admin(pg_server) as other:
        first = await ask(a, e, A, ttl=15, timeout=5)
        killed = await other.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'leaderd-term-test' AND query NOT LIKE 'LISTEN%'"
        )
        assert killed >= 1
        await asyncio.sleep(0.05)
        again = await ask(a, e, A, ttl=15, timeout=5)
        assert again.held_by(A) and again.term == first.term
