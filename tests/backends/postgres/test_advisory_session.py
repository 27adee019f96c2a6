"""postgresql+advisory:// specifics: the lock session's life (its keepalives, a keepalive in
doubt, a hung term bump, the order of a release), NOTIFYs and a reused pid."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import pytest

from leaderd.backends import BackendUnavailable
from leaderd.backends.postgres.listen import notify_channel
from tests.backends.postgres.advisory_locks import A, B, blocked, lock_pids, url
from tests.backends.postgres.helpers import (
    admin,
    opened,
    session_pid,
    unique,
)
from tests.support.backend_calls import ask, release
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.postgres


async def test_a_silent_leaders_session_ends_one_ttl_after_its_last_keepalive(
    pg_server: PgServer,
) -> None:
    """Hole (a): a paused leader must not hold the lock forever; and never for less than
    one ttl after its last keepalive was sent (hole (b), the deadline side)."""
    u, e = url(pg_server), unique()
    async with opened(u, e) as a, opened(u, e) as b:
        t_send = time.monotonic()
        mine = await ask(a, e, A, ttl=1.0, timeout=5)
        assert mine.held_by(A)
        granted = await ask(b, e, B, ttl=1.0, timeout=5, wait=3)
        waited = time.monotonic() - t_send
        # The lock passed on; the unreleased row is taken over by naming its version.
        assert (granted.holder, granted.term) == (A.node_id, mine.term), granted
        assert waited >= 1.0, waited  # hole (b): never before one ttl
        await asyncio.sleep(granted.expires_in or 0.0)
        # Hole (a): the lock did pass, within b's wait: this request waits for no lock.
        theirs = await ask(b, e, B, ttl=1.0, timeout=5, takeover=granted.version)
        assert theirs.held_by(B) and theirs.term == mine.term + 1


async def test_a_stuck_keepalive_fails_and_keeps_the_lock_while_the_leader_may_lead(
    pg: PgServer,
) -> None:
    """A keepalive in doubt is a failure (the engine keeps its last error, and leads only
    until its deadline), not a "not held" answer; the session, and its lock, are kept."""
    u, e, ttl = url(pg), unique(), 5.0
    async with opened(u, e) as a, admin(pg) as other:
        mine = await ask(a, e, A, ttl=ttl, timeout=5)
        pid = session_pid(a, e)
        os.kill(pid, signal.SIGSTOP)  # the server side of the session hangs
        try:
            for _ in range(2):
                # The request's own bound fired, while the server was still stopped.
                with pytest.raises(BackendUnavailable, match=r"timed out after 0\.5s"):
                    await ask(a, e, A, ttl=ttl, timeout=0.5)
                # Not freed behind the engine's back: the lock is still the session's.
                assert await lock_pids(other, e) == [pid]
        finally:
            os.kill(pid, signal.SIGCONT)
        again = await ask(a, e, A, ttl=ttl, timeout=5)
        assert again.held_by(A) and again.term == mine.term and session_pid(a, e) == pid


async def test_a_keepalive_in_doubt_past_one_ttl_lets_the_session_go(pg: PgServer) -> None:
    """Once the engine's deadline has passed (one ttl after the last renewal was sent),
    the doubtful session is closed and the lock campaigned for anew: a new term."""
    u, e, ttl = url(pg), unique(), 1.0
    async with opened(u, e) as a, admin(pg) as other:
        mine = await ask(a, e, A, ttl=ttl, timeout=5)
        pid = session_pid(a, e)
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(BackendUnavailable):
                await ask(a, e, A, ttl=ttl, timeout=0.3)
            await asyncio.sleep(ttl)
            with pytest.raises(BackendUnavailable):
                await ask(a, e, A, ttl=ttl, timeout=0.3)
        finally:
            os.kill(pid, signal.SIGCONT)
        lease = None
        for _ in range(100):
            with contextlib.suppress(BackendUnavailable):  # the old session still exiting
                lease = await ask(a, e, A, ttl=ttl, timeout=2)
                if lease.held_by(A):
                    break
            await asyncio.sleep(0.05)
        assert lease is not None and lease.held_by(A), lease
        assert lease.term == mine.term + 1 and await lock_pids(other, e) == [session_pid(a, e)]
        assert session_pid(a, e) != pid


async def test_a_hung_term_bump_gives_up_and_releases(pg_server: PgServer) -> None:
    table, e = unique("adv"), unique()
    u = pg_server.dsn(scheme="postgresql+advisory", table=table)
    async with opened(u, e) as a, opened(u, e) as b, admin(pg_server) as other:
        mine = await ask(a, e, A, ttl=15, timeout=5)
        await release(a, e, A, mine.term)
        tx = other.transaction()
        await tx.start()
        await other.execute(f"SELECT * FROM {table} WHERE election = $1 FOR UPDATE", e)
        try:
            # The request's own bound fired, while the row was still locked.
            with pytest.raises(BackendUnavailable, match=r"timed out after 0\.5s"):
                await ask(b, e, B, ttl=15, timeout=0.5, wait=0.2)
            for _ in range(100):  # the session that got the lock is closed: lock free again
                if not await lock_pids(other, e):
                    break
                await asyncio.sleep(0.01)
            assert await lock_pids(other, e) == []
        finally:
            await tx.rollback()


async def test_a_release_commits_before_the_lock_is_freed(pg_server: PgServer) -> None:
    """A standby blocked in the lock is granted it only once the release is committed: it
    reads the released row and claims at once, instead of waiting out a lease that was
    released (the unlock used to run inside the releasing transaction, before its commit)."""
    table, e = unique("adv"), unique()
    u = pg_server.dsn(scheme="postgresql+advisory", table=table)
    async with opened(u, e) as a, opened(u, e) as b, admin(pg_server) as other:
        mine = await ask(a, e, A, ttl=15, timeout=5)
        # A commit that takes its time, as on a loaded server: a deferred trigger on the
        # release's update runs at commit, after the statement.
        await other.execute(f"""
            CREATE FUNCTION {table}_slow() RETURNS trigger LANGUAGE plpgsql
                AS $$ BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$;
            CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON {table}
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.holder IS NULL)
                EXECUTE FUNCTION {table}_slow();
        """)
        # Knowing mine.term, as the engine's standby would (min_term: its high-water + 1):
        # else the NOTIFY of that term, delivered once the wait began, ends the wait early.
        waiter = asyncio.create_task(
            ask(b, e, B, ttl=15, timeout=10, wait=5, min_term=mine.term + 1)
        )
        await blocked(other, e, 1)
        await release(a, e, A, mine.term)
        theirs = await asyncio.wait_for(waiter, 3)
        assert theirs.held_by(B) and theirs.term == mine.term + 1, theirs


async def test_a_late_acquired_notify_does_not_end_a_standbys_lock_wait(
    pg_server: PgServer,
) -> None:
    table, e = unique("adv"), unique()
    u = pg_server.dsn(scheme="postgresql+advisory", table=table)
    async with opened(u, e) as a, opened(u, e) as b, admin(pg_server) as other:
        mine = await ask(a, e, A, ttl=15, timeout=5)
        # The engine's standby waits knowing term mine.term (min_term: its high-water + 1).
        waiter = asyncio.create_task(
            ask(b, e, B, ttl=15, timeout=10, wait=5, min_term=mine.term + 1)
        )
        await blocked(other, e, 1)
        # The announcement of the term it already knows, delivered late.
        payload = f"{mine.term} acquired {e}"
        await other.execute("SELECT pg_notify($1, $2)", notify_channel(table), payload)
        await asyncio.sleep(0.3)
        assert not waiter.done(), f"old news ended the lock wait: {waiter.result()}"
        await release(a, e, A, mine.term)
        theirs = await asyncio.wait_for(waiter, 2)
        assert theirs.held_by(B) and theirs.term == mine.term + 1


async def test_a_reused_pid_is_not_taken_for_the_holders_session(pg_server: PgServer) -> None:
    """The row names the holder's session by pid and start time: a successor whose session
    has the dead holder's pid (the kernel reuses pids) still waits out that holder's lease,
    and observers do not report the dead session's holder as live."""
    table, e = unique("adv"), unique()
    u = pg_server.dsn(scheme="postgresql+advisory", table=table)
    async with opened(u, e) as a, opened(u, e) as b, opened(u, e) as c, admin(pg_server) as other:
        mine = await ask(a, e, A, ttl=15, timeout=5)
        waiter = asyncio.create_task(
            ask(b, e, B, ttl=15, timeout=10, wait=5, min_term=mine.term + 1)
        )
        await blocked(other, e, 1)
        await other.execute("SELECT pg_terminate_backend($1)", session_pid(a, e))
        pending = await asyncio.wait_for(waiter, 2)
        assert pending.holder == A.node_id and not pending.held_by(B)
        # As if B's session had been given the dead session's pid:
        sql = f"UPDATE {table} SET pid = $1 WHERE election = $2"
        await other.execute(sql, session_pid(b, e), e)
        again = await ask(b, e, B, ttl=15, timeout=5)
        assert not again.held_by(B) and (again.holder, again.term) == (A.node_id, mine.term)
        seen = await c.observe(e)
        assert seen.holder == A.node_id and seen.expires_in is not None, seen  # not live
