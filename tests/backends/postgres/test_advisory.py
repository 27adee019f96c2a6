"""postgresql+advisory:// specifics: the key, the lock session, and its two holes (the lock
session's life is test_advisory_session.py's)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from leaderd.backends import Candidate
from leaderd.backends.postgres.advisory import advisory_key
from tests.backends.postgres.advisory_locks import A, B, blocked, lock_pids, url
from tests.backends.postgres.helpers import (
    WAITING_FOR_A_LOCK,
    admin,
    lock_queue_empties,
    opened,
    session_pid,
    standby_session_pids,
    unique,
    until,
)
from tests.support.backend_calls import ask, release
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.postgres

KEY_SQL = (
    "SELECT ('x' || left(encode(sha256(convert_to('leaderd:' || $1, 'UTF8')), 'hex'), 16))"
    "::bit(64)::bigint"
)


async def test_the_key_is_documented_and_visible_in_pg_locks(pg_server: PgServer) -> None:
    e = unique()
    async with opened(url(pg_server), e) as a, admin(pg_server) as other:
        for name in (e, "default", "scheduler", "ünïcode"):
            assert await other.fetchval(KEY_SQL, name) == advisory_key(name)
        assert advisory_key("default") == 8011582017960662368
        await ask(a, e, A, ttl=15, timeout=5)
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
        mine = await ask(a, e, A, ttl=15, timeout=5)
        # Only the termination can end either wait before the test's: the lock wait and the
        # holder's wait for a change are each longer than the test waits for them.
        waiter = asyncio.create_task(ask(b, e, B, ttl=15, timeout=70, wait=60))
        holder_wakes = asyncio.create_task(a.wait_for_change(e, 3600))
        await blocked(other, e, 1)
        t0 = time.monotonic()
        await other.execute("SELECT pg_terminate_backend($1)", session_pid(a, e))
        theirs = await asyncio.wait_for(waiter, 10)
        took_over = time.monotonic() - t0
        await asyncio.wait_for(holder_wakes, 10)
        # asyncpg's termination listener told the holder its session ended: it made no
        # request since, so nothing else can have noticed.
        assert await until(lambda: a._sessions[e].conn is None, 10)  # type: ignore[attr-defined]
        assert theirs.held_by(B) and theirs.term == mine.term + 1
        print(f"\nadvisory: holder terminated -> waiter holds in {took_over * 1000:.1f} ms")
        after = await ask(a, e, A, ttl=15, timeout=5)
        assert not after.held_by(A)
        seen = await ask(a, e, A, ttl=15, timeout=5)
        assert seen.holder == B.node_id and seen.term == theirs.term


async def test_by_default_a_waiter_waits_out_a_terminated_holders_lease(
    pg_server: PgServer,
) -> None:
    """takeover=wait: the server ended the holder's session, but that node may be alive and
    still answering "leader" until its lease runs out; the successor claims nothing before
    then, and not before its engine names the version it watched."""
    u, e, ttl = url(pg_server), unique(), 1.0
    async with opened(u, e) as a, opened(u, e) as b, admin(pg_server) as other:
        # B's session opens now: A's session ends by itself after one ttl idle (the server's
        # idle_session_timeout), so B must be waiting in the lock by then. Opening a session
        # (connect, plan, prepare) on a loaded machine took longer than that.
        await b.observe(e)
        # Before A's claim: its lease runs from the claim's commit, which comes later.
        t0 = time.monotonic()
        mine = await ask(a, e, A, ttl=ttl, timeout=5)
        waiter = asyncio.create_task(
            ask(b, e, B, ttl=ttl, timeout=10, wait=5, min_term=mine.term + 1)
        )
        await blocked(other, e, 1)
        await other.execute("SELECT pg_terminate_backend($1)", session_pid(a, e))
        pending = await asyncio.wait_for(waiter, 2)
        assert pending.holder == A.node_id and pending.term == mine.term
        assert pending.expires_in is not None and 0 < pending.expires_in <= ttl
        # While A's lease lasts the successor gives the lock back (A may come back) ...
        assert await lock_pids(other, e) == []
        # Naming the version is not enough while the lease lasts on the server's clock ...
        too_soon = await ask(b, e, B, ttl=ttl, timeout=5, takeover=pending.version)
        assert not too_soon.held_by(B) and too_soon.holder == A.node_id
        await asyncio.sleep(pending.expires_in)
        # ... and its end is not enough without naming the version (docs/algorithm.md).
        unnamed = await ask(b, e, B, ttl=ttl, timeout=5)
        assert unnamed.expired and unnamed.version == pending.version
        assert await lock_pids(other, e) == [session_pid(b, e)], "kept once the lease is over"
        theirs = await ask(b, e, B, ttl=ttl, timeout=5, takeover=pending.version)
        waited = time.monotonic() - t0
        assert theirs.held_by(B) and theirs.term == mine.term + 1
        print(f"\nadvisory: A claimed -> successor claims after {waited * 1000:.0f} ms")
        # No sooner than A's whole lease (the server's clock and this one tick alike).
        assert waited >= ttl - 0.01


async def test_a_holder_whose_session_ended_renews_even_if_a_standby_got_the_lock_first(
    pg_server: PgServer,
) -> None:
    """After a server restart (or a terminated session) the leader, alive, reconnects; a
    standby that got the lock first must not keep it through the leader's lease: the
    leader renews through its new session, with the same term, and nobody is waited out."""
    u, e = url(pg_server), unique()
    async with opened(u, e) as a, opened(u, e) as b, admin(pg_server) as other:
        mine = await ask(a, e, A, ttl=15, timeout=5)
        waiter = asyncio.create_task(
            ask(b, e, B, ttl=15, timeout=10, wait=5, min_term=mine.term + 1)
        )
        await blocked(other, e, 1)
        await other.execute("SELECT pg_terminate_backend($1)", session_pid(a, e))
        pending = await asyncio.wait_for(waiter, 2)  # the standby had the lock first
        assert pending.holder == A.node_id and not pending.held_by(B)
        assert await until(lambda: a._sessions[e].conn is None, 1)  # type: ignore[attr-defined]
        again = await ask(a, e, A, ttl=15, timeout=5)  # a new session
        assert again.held_by(A), again
        assert (again.term, again.acquired_at) == (mine.term, mine.acquired_at)


async def queued_hand_over(a: Any, b: Any, other: Any, e: str) -> int:
    """A holds, B waits in the lock queue, A releases: B claims at once, term + 1 (its term)."""
    mine = await ask(a, e, A, ttl=15, timeout=5)
    waiter = asyncio.create_task(ask(b, e, B, ttl=15, timeout=10, wait=5, min_term=mine.term + 1))
    await blocked(other, e, 1)
    await release(a, e, A, mine.term)
    theirs = await asyncio.wait_for(waiter, 2)
    assert theirs.held_by(B) and theirs.term == mine.term + 1
    return theirs.term


async def test_a_clean_release_needs_no_wait(pg_server: PgServer) -> None:
    u, e = url(pg_server), unique()
    async with opened(u, e) as a, opened(u, e) as b, admin(pg_server) as other:
        await queued_hand_over(a, b, other, e)


LOSER_APP = "leaderd-loser-test"


async def lose_the_race(pg: PgServer, cancel_works: bool) -> tuple[str, bool]:
    """A holds, B and C wait in the lock queue, A releases: (the loser's node id, whether
    its lock session is the one it had). Both name the winner at once, and nobody is left
    in the lock queue, whichever way the loser's wait ends."""
    u, e = url(pg, application_name=LOSER_APP), unique()
    c = Candidate("node-c", "10.0.0.3:80")
    async with (
        opened(u, e) as a,
        opened(u, e) as b,
        opened(u, e) as third,
        admin(pg) as other,
    ):
        mine = await ask(a, e, A, ttl=15, timeout=5)
        standbys = {B.node_id: b, c.node_id: third}
        for standby, who in ((b, B), (third, c)):  # open and plan each standby's session
            assert (await ask(standby, e, who, ttl=15, timeout=5, wait=0.1)).holder
            if not cancel_works:
                standby._listener.cancel = refuse  # type: ignore[attr-defined]
        pids = {node: session_pid(backend, e) for node, backend in standbys.items()}
        waiters = [
            asyncio.create_task(ask(b, e, B, ttl=15, timeout=10, wait=5)),
            asyncio.create_task(ask(third, e, c, ttl=15, timeout=10, wait=5)),
        ]
        await blocked(other, e, 2)
        await release(a, e, A, mine.term)
        # The loser does not sit out its 5 s lock wait naming the old holder: both answer
        # before it could have ended.
        answers = await asyncio.wait_for(asyncio.gather(*waiters), 3)
        winner = answers[0].holder
        assert winner in standbys and all(x.holder == winner for x in answers), answers
        assert answers[0].term == mine.term + 1
        assert await lock_queue_empties(other, LOSER_APP)
        loser = next(node for node in standbys if node != winner)
        return loser, session_pid(standbys[loser], e) == pids[loser]


async def refuse(pid: int, timeout: float) -> bool:
    return False  # what Listener.cancel says when its connection is down or busy


async def test_a_waiter_that_loses_the_race_names_the_new_holder_at_once_on_its_session(
    pg_server: PgServer,
) -> None:
    """The loser's wait is cancelled over its LISTEN connection, and its session, with the
    plans it holds, is kept: closing it cost a server process for the cancel and one for
    the next read, on the cores where the winner claims."""
    loser, kept = await lose_the_race(pg_server, cancel_works=True)
    assert kept, f"{loser}'s lock session was replaced"


async def test_when_the_listen_connection_cannot_cancel_the_loser_closes_its_session(
    pg_server: PgServer,
) -> None:
    loser, kept = await lose_the_race(pg_server, cancel_works=False)
    assert not kept, f"{loser} kept a session whose wait nobody cancelled"


async def test_a_lock_granted_as_its_wait_is_cancelled_is_given_back(pg_server: PgServer) -> None:
    """The race the cancel may lose, made certain: the standby's server process is stopped
    while the lock is freed and a cancel is sent, so it resumes with both. It checks for
    interrupts before it looks at its grant: the statement ends with "canceling statement",
    yet the session keeps the lock. It must give it back, or the single unlock of its own
    release later would leave the lock held (advisory locks count)."""
    u, e = url(pg_server), unique()
    key = advisory_key(e)
    async with opened(u, e) as b, admin(pg_server) as other, admin(pg_server) as holder:
        assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", key)
        assert (await ask(b, e, B, ttl=15, timeout=5, wait=0.1)).holder is None
        waiter = asyncio.create_task(ask(b, e, B, ttl=15, timeout=10, wait=5))
        await blocked(other, e, 1)
        pid = session_pid(b, e)
        os.kill(pid, signal.SIGSTOP)
        try:
            await holder.fetchval("SELECT pg_advisory_unlock($1)", key)
            assert await other.fetchval("SELECT pg_cancel_backend($1)", pid)
        finally:
            os.kill(pid, signal.SIGCONT)
        theirs = await asyncio.wait_for(waiter, 5)  # given back, then taken at once
        assert theirs.held_by(B), theirs
        await release(b, e, B, theirs.term)
        assert await lock_pids(other, e) == [], "the lock outlived the release"


async def test_a_standby_keeps_its_lock_session_through_rounds_that_time_out(
    pg_server: PgServer,
) -> None:
    """A lock wait that ends by its lock_timeout is a quiet round, not news: the session
    stays (a new one is a new server process, and plans its statements again)."""
    u, e = url(pg_server), unique()
    async with opened(u, e) as a, opened(u, e) as b:
        await ask(a, e, A, ttl=15, timeout=5)
        pids = await standby_session_pids(b, e, B, A.node_id, ttl=15, timeout=5)
        assert len(pids) == 1, f"the standby's session changed: server pids {sorted(pids)}"


async def test_a_cancelled_waiter_leaves_the_lock_queue(pg_server: PgServer) -> None:
    u, e = url(pg_server, application_name="leaderd-cancel-test"), unique()
    async with opened(u, e) as a, opened(u, e) as b, admin(pg_server) as other:
        mine = await ask(a, e, A, ttl=15, timeout=5)
        waiter = asyncio.create_task(
            ask(b, e, B, ttl=15, timeout=10, wait=5, min_term=mine.term + 1)
        )
        await blocked(other, e, 1)
        assert await other.fetchval(WAITING_FOR_A_LOCK, "leaderd-cancel-test") == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert await lock_queue_empties(other, "leaderd-cancel-test")
