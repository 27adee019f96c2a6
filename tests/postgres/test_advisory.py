"""postgresql+advisory:// specifics: the key, the lock session, and its two holes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from leaderd.backends import BackendUnavailable, Candidate
from leaderd.backends.advisory import PostgresAdvisoryBackend, advisory_key
from tests.pgserver import PgServer
from tests.postgres.helpers import Stopwatch, admin, opened, unique

pytestmark = pytest.mark.postgres

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")

KEY_SQL = (
    "SELECT ('x' || left(encode(sha256(convert_to('leaderd:' || $1, 'UTF8')), 'hex'), 16))"
    "::bit(64)::bigint"
)
HOLDER_SQL = """
SELECT a.pid, a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND ((l.classid::int8 << 32) | l.objid::int8) = $1
"""


def url(pg: PgServer, **params: str) -> str:
    return pg.dsn(scheme="postgresql+advisory", table=unique("adv"), **params)


async def lock_pids(conn: Any, election: str) -> list[int]:
    return [r["pid"] for r in await conn.fetch(HOLDER_SQL, advisory_key(election))]


def session_pid(backend: Any, election: str) -> int:
    assert isinstance(backend, PostgresAdvisoryBackend)
    return int(backend._sessions[election].conn.get_server_pid())


async def test_the_key_is_documented_and_visible_in_pg_locks(pg_server: PgServer) -> None:
    e = unique()
    async with opened(url(pg_server), e) as a, admin(pg_server) as other:
        for name in (e, "default", "scheduler", "ünïcode"):
            assert await other.fetchval(KEY_SQL, name) == advisory_key(name)
        assert advisory_key("default") == 8011582017960662368
        await a.acquire_or_renew(e, A, ttl=15, timeout=5)
        assert await lock_pids(other, e) == [session_pid(a, e)]
        settings = await a._sessions[e].conn.fetchrow(  # type: ignore[attr-defined]
            "SELECT current_setting('idle_session_timeout') AS idle, "
            "current_setting('tcp_user_timeout') AS user_timeout, "
            "current_setting('tcp_keepalives_idle') AS ka_idle"
        )
        # The socket's own values (SHOW asks the kernel): ms, then s.
        assert tuple(settings) == ("15s", "15000", "15")


async def test_terminated_holder_steps_down_and_a_waiter_takes_over(
    pg_server: PgServer,
) -> None:
    u, e = url(pg_server, takeover="immediate"), unique()
    async with opened(u, e) as a, opened(u, e) as b, admin(pg_server) as other:
        mine = await a.acquire_or_renew(e, A, ttl=15, timeout=5)
        waiter = asyncio.create_task(b.acquire_or_renew(e, B, ttl=15, timeout=10, wait=5))
        holder_wakes = asyncio.create_task(a.wait_for_change(e, 5))
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        await other.execute("SELECT pg_terminate_backend($1)", session_pid(a, e))
        theirs = await asyncio.wait_for(waiter, 2)
        took_over = time.monotonic() - t0
        await asyncio.wait_for(holder_wakes, 1)  # the termination listener woke it at once
        assert time.monotonic() - t0 < 0.5
        assert theirs.held_by(B.node_id) and theirs.term == mine.term + 1
        print(f"\nadvisory: holder terminated -> waiter holds in {took_over * 1000:.1f} ms")
        assert took_over < 0.5
        after = await a.acquire_or_renew(e, A, ttl=15, timeout=5)
        assert not after.held_by(A.node_id)
        seen = await a.acquire_or_renew(e, A, ttl=15, timeout=5)
        assert seen.holder == B.node_id and seen.term == theirs.term


async def test_by_default_a_waiter_waits_out_a_terminated_holders_lease(
    pg_server: PgServer,
) -> None:
    """takeover=wait: the server ended the holder's session, but that node may be alive and
    still answering "leader" until its lease runs out; the successor holds the lock and
    claims nothing before then."""
    u, e, ttl = url(pg_server), unique(), 1.0
    async with opened(u, e) as a, opened(u, e) as b, admin(pg_server) as other:
        mine = await a.acquire_or_renew(e, A, ttl=ttl, timeout=5)
        waiter = asyncio.create_task(b.acquire_or_renew(e, B, ttl=ttl, timeout=10, wait=5))
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        await other.execute("SELECT pg_terminate_backend($1)", session_pid(a, e))
        pending = await asyncio.wait_for(waiter, 2)
        assert pending.holder == A.node_id and pending.term == mine.term
        assert pending.expires_in is not None and 0 < pending.expires_in <= ttl
        assert await lock_pids(other, e) == [session_pid(b, e)], "the successor keeps the lock"
        await asyncio.sleep(pending.expires_in)
        theirs = await b.acquire_or_renew(e, B, ttl=ttl, timeout=5)
        waited = time.monotonic() - t0
        assert theirs.held_by(B.node_id) and theirs.term == mine.term + 1
        print(f"\nadvisory: holder terminated -> successor claims after {waited * 1000:.0f} ms")
        assert waited >= ttl * 0.8  # no sooner than the holder's lease allowed


async def test_a_clean_release_needs_no_wait(pg_server: PgServer) -> None:
    u, e = url(pg_server), unique()
    async with opened(u, e) as a, opened(u, e) as b:
        mine = await a.acquire_or_renew(e, A, ttl=15, timeout=5)
        waiter = asyncio.create_task(b.acquire_or_renew(e, B, ttl=15, timeout=10, wait=5))
        await asyncio.sleep(0.1)
        await a.release(e, A, mine.term)
        theirs = await asyncio.wait_for(waiter, 2)
        assert theirs.held_by(B.node_id) and theirs.term == mine.term + 1


async def test_waiters_that_lose_the_race_name_the_new_holder_at_once(
    pg_server: PgServer,
) -> None:
    u, e = url(pg_server), unique()
    c = Candidate("node-c", "10.0.0.3:80")
    async with opened(u, e) as a, opened(u, e) as b, opened(u, e) as third:
        mine = await a.acquire_or_renew(e, A, ttl=15, timeout=5)
        waiters = [
            asyncio.create_task(b.acquire_or_renew(e, B, ttl=15, timeout=10, wait=5)),
            asyncio.create_task(third.acquire_or_renew(e, c, ttl=15, timeout=10, wait=5)),
        ]
        await asyncio.sleep(0.2)
        with Stopwatch() as sw:
            await a.release(e, A, mine.term)
            answers = await asyncio.wait_for(asyncio.gather(*waiters), 3)
        winner = next(lease for lease in answers if lease.holder in (B.node_id, c.node_id))
        # The loser does not sit out its 5 s lock wait naming the old holder.
        assert all(lease.holder == winner.holder for lease in answers), answers
        assert winner.term == mine.term + 1 and sw.elapsed < 1.0


async def test_a_cancelled_waiter_leaves_the_lock_queue(pg_server: PgServer) -> None:
    u, e = url(pg_server, application_name="leaderd-cancel-test"), unique()
    async with opened(u, e) as a, opened(u, e) as b, admin(pg_server) as other:
        await a.acquire_or_renew(e, A, ttl=15, timeout=5)
        waiter = asyncio.create_task(b.acquire_or_renew(e, B, ttl=15, timeout=10, wait=5))
        await asyncio.sleep(0.1)
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
            "'leaderd-cancel-test' AND wait_event = 'advisory'"
        )
        assert await other.fetchval(waiting) == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        for _ in range(50):
            if await other.fetchval(waiting) == 0:
                break
            await asyncio.sleep(0.01)
        assert await other.fetchval(waiting) == 0


async def test_a_silent_leaders_session_ends_one_ttl_after_its_last_keepalive(
    pg_server: PgServer,
) -> None:
    """Hole (a): a paused leader must not hold the lock forever; and never for less than
    one ttl after its last keepalive was sent (hole (b), the deadline side)."""
    u, e = url(pg_server), unique()
    async with opened(u, e) as a, opened(u, e) as b:
        t_send = time.monotonic()
        mine = await a.acquire_or_renew(e, A, ttl=1.0, timeout=5)
        assert mine.held_by(A.node_id)
        theirs = await b.acquire_or_renew(e, B, ttl=1.0, timeout=5, wait=3)
        waited = time.monotonic() - t_send
        assert theirs.held_by(B.node_id) and theirs.term == mine.term + 1
        assert 1.0 <= waited < 1.8, waited


async def test_a_stuck_keepalive_reports_not_held_and_keeps_the_lock_until_asked_again(
    pg: PgServer,
) -> None:
    u, e = url(pg), unique()
    async with opened(u, e) as a, opened(u, e) as b, admin(pg) as other:
        await a.acquire_or_renew(e, A, ttl=15, timeout=5)
        pid = session_pid(a, e)
        os.kill(pid, signal.SIGSTOP)  # the server side of the session hangs
        try:
            with Stopwatch() as sw:
                lease = await a.acquire_or_renew(e, A, ttl=15, timeout=0.5)
            assert not lease.held_by(A.node_id) and sw.elapsed < 0.8
            # Not released behind the engine's back: the lock is still the old session's.
            assert await lock_pids(other, e) == [pid]
        finally:
            os.kill(pid, signal.SIGCONT)
        # The next call closes the doubtful session; then B can have the lock.
        await a.acquire_or_renew(e, A, ttl=15, timeout=5)
        theirs = await b.acquire_or_renew(e, B, ttl=15, timeout=5, wait=2)
        assert theirs.held_by(B.node_id) or theirs.holder == A.node_id


async def test_a_hung_term_bump_gives_up_and_releases(pg_server: PgServer) -> None:
    table, e = unique("adv"), unique()
    u = pg_server.dsn(scheme="postgresql+advisory", table=table)
    async with opened(u, e) as a, opened(u, e) as b, admin(pg_server) as other:
        mine = await a.acquire_or_renew(e, A, ttl=15, timeout=5)
        await a.release(e, A, mine.term)
        tx = other.transaction()
        await tx.start()
        await other.execute(f"SELECT * FROM {table} WHERE election = $1 FOR UPDATE", e)
        try:
            with Stopwatch() as sw, pytest.raises(BackendUnavailable, match="timed out"):
                await b.acquire_or_renew(e, B, ttl=15, timeout=0.5, wait=0.2)
            assert sw.elapsed < 0.8
            for _ in range(100):  # the session that got the lock is closed: lock free again
                if not await lock_pids(other, e):
                    break
                await asyncio.sleep(0.01)
            assert await lock_pids(other, e) == []
        finally:
            await tx.rollback()
