"""Behaviour both PostgreSQL backends share, against a real server (no mocks)."""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time

import pytest

from leaderd.backends import BackendFatal, BackendUnavailable, Candidate, backend_from_url
from tests.backends.postgres.helpers import opened, unique, url
from tests.support.backend_calls import ask, release
from tests.support.pgserver import PASSWORD, PASSWORD_USER, PgServer

pytestmark = pytest.mark.postgres

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")


@pytest.fixture
def table() -> str:
    return unique("t")


async def test_fencing_term_increases_and_is_stored(
    pg_server: PgServer, scheme: str, table: str
) -> None:
    e = unique()
    u = url(pg_server, scheme, table=table)
    async with opened(u, e) as a, opened(u, e) as b:
        first = await ask(a, e, A, ttl=15, timeout=5)
        assert first.held_by(A) and first.term >= 1
        assert first.address == A.address
        renewed = await ask(a, e, A, ttl=15, timeout=5)
        assert renewed.held_by(A) and renewed.term == first.term
        seen = await ask(b, e, B, ttl=15, timeout=5)
        assert seen.holder == A.node_id and seen.term == first.term
        await release(a, e, A, first.term)
        released = await b.observe(e)
        assert released.holder is None and released.term == first.term
        second = await ask(b, e, B, ttl=15, timeout=5)
        assert second.held_by(B) and second.term == first.term + 1
        await release(b, e, B, second.term)
        third = await ask(a, e, A, ttl=15, timeout=5)
        assert third.held_by(A) and third.term == second.term + 1
    # A new backend instance (a restarted daemon) sees the stored term.
    async with opened(u, e) as c:
        assert (await c.observe(e)).term == third.term


async def test_release_passes_to_a_waiter_within_a_round_trip(
    pg_server: PgServer, scheme: str, table: str
) -> None:
    u = url(pg_server, scheme, table=table)
    e = unique()
    latencies = []
    async with opened(u, e) as a, opened(u, e) as b:
        await asyncio.sleep(0.1)  # the lease backend's LISTEN connection is up
        for i in range(10):
            leader, backend_l, standby, backend_s = (A, a, B, b) if i % 2 == 0 else (B, b, A, a)
            lease = await ask(backend_l, e, leader, ttl=15, timeout=5)
            assert lease.held_by(leader)

            requests: list[float] = []

            async def follow(backend=backend_s, me=standby, requests=requests):  # type: ignore[no-untyped-def]
                while True:  # the engine's follower loop; its waits outlast the test's
                    requests.append(time.monotonic())
                    got = await ask(backend, e, me, ttl=15, timeout=70, wait=60)
                    if got.held_by(me):
                        return time.monotonic(), got
                    await backend.wait_for_change(e, 3600)

            task = asyncio.create_task(follow())
            await asyncio.sleep(0.05)  # the standby is waiting
            t0 = time.monotonic()
            await release(backend_l, e, leader, lease.term)
            t1, got = await asyncio.wait_for(task, 10)
            assert got.term == lease.term + 1
            # Held on the release's wake-up: the request that waited for the lock (advisory),
            # or the one after the wait for a change (lease); no round of its own.
            assert len(requests) <= 2, requests
            latencies.append(t1 - t0)
    p50 = statistics.median(latencies)
    print(  # the latency itself is bench/'s to measure
        f"\n{scheme}: release -> standby holds: p50 {p50 * 1000:.1f} ms, "
        f"max {max(latencies) * 1000:.1f} ms"
    )


async def test_server_restart_reconnects_and_terms_keep_increasing(
    pg: PgServer, scheme: str, table: str
) -> None:
    e = unique()
    u = url(pg, scheme, table=table)
    async with opened(u, e) as a, opened(u, e) as b:
        first = await ask(a, e, A, ttl=15, timeout=5)
        await asyncio.to_thread(pg.restart)
        # The first calls may fail or report the lost session; it comes back quickly.
        lease = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                lease = await ask(a, e, A, ttl=15, timeout=2)
                if lease.held_by(A):
                    break
            except BackendUnavailable:
                pass
            await asyncio.sleep(0.1)
        assert lease is not None and lease.held_by(A)
        assert lease.term >= first.term  # the lease row survived; the advisory lock did not
        await release(a, e, A, lease.term)
        other = await ask(b, e, B, ttl=15, timeout=5)
        assert other.held_by(B) and other.term == lease.term + 1


async def test_server_stopped_requests_fail_within_the_timeout(
    pg: PgServer, scheme: str, table: str
) -> None:
    e = unique()
    u = url(pg, scheme, table=table)
    async with opened(u, e) as a:
        await ask(a, e, A, ttl=15, timeout=5)
        await asyncio.to_thread(pg.stop)
        # Each request ends on the server's own answer (nobody listens: refused), never by
        # waiting out its timeout; a request that hangs is test_unresponsive_server_...'s.
        for _ in range(3):
            try:
                lease = await ask(a, e, A, ttl=15, timeout=1)
                assert not lease.held_by(A)  # the advisory session is gone
            except BackendUnavailable as exc:
                assert PASSWORD not in str(exc)
                assert "timed out" not in str(exc), exc
        with pytest.raises(BackendUnavailable, match="ConnectionRefusedError"):
            await ask(a, e, A, ttl=15, timeout=1)


async def test_unresponsive_server_never_hangs_a_request(
    pg: PgServer, scheme: str, table: str
) -> None:
    """SIGSTOP the postmaster: new connections hang in the startup handshake."""
    e = unique()
    backend_url = url(pg, scheme, table=table)
    async with opened(backend_url, e) as a:
        pid = pg.postmaster_pid()
        assert pid is not None
        a2 = type(a).from_url(backend_url)  # no open connection yet
        os.kill(pid, signal.SIGSTOP)
        try:
            # The request's own bound fired, while the postmaster was still stopped.
            with pytest.raises(BackendUnavailable, match=r"timed out after 0\.5s"):
                await ask(a2, e, A, ttl=15, timeout=0.5)
        finally:
            os.kill(pid, signal.SIGCONT)
            await a2.close()


async def test_password_never_in_messages_or_description(
    pg: PgServer, scheme: str, table: str
) -> None:
    e = unique()
    good = pg.dsn(PASSWORD_USER, PASSWORD, scheme=scheme, table=table)
    async with opened(good, e) as a:
        assert PASSWORD not in a.description and "***" in a.description
        await ask(a, e, A, ttl=15, timeout=5)
        await asyncio.to_thread(pg.stop)
        for _ in range(2):
            try:
                await ask(a, e, A, ttl=15, timeout=1)
            except BackendUnavailable as exc:
                assert PASSWORD not in str(exc) and PASSWORD not in repr(exc.args)
    await asyncio.to_thread(pg.start)
    wrong = pg.dsn(PASSWORD_USER, PASSWORD + "-wrong", scheme=scheme, table=table)
    backend = type(a).from_url(wrong)
    with pytest.raises(BackendFatal) as info:
        await backend.open([e])
    assert PASSWORD not in str(info.value) and "password authentication failed" in str(info.value)
    await backend.close()
    with pytest.raises(BackendFatal) as info:
        type(a).from_url(pg.dsn(PASSWORD_USER, PASSWORD, scheme=scheme, table="x; DROP"))
    assert PASSWORD not in str(info.value)


async def test_missing_database_is_fatal(pg_server: PgServer, scheme: str) -> None:
    backend = backend_from_url(pg_server.dsn(database="no_such_db", scheme=scheme))
    with pytest.raises(BackendFatal, match="does not exist"):
        await backend.open(["e"])
    await backend.close()
