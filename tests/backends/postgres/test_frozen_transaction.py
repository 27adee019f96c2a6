"""A server that freezes while a request is inside a transaction: the request still ends
within its own timeout, while the server is still frozen.

asyncpg rolls back a cancelled transaction only after the CancelRequest it sent for the
running statement is answered, and a frozen postmaster (SIGSTOP, a paused VM) never
answers it. A request timed out inside a transaction then waited for the server to wake,
and so did the election loop that awaits it: a leader whose server froze at that moment
ran no demote hook and told no watcher, for as long as the server stayed frozen
(tests/jobs/test_hooks.py's frozen server met it once in a full run).

The transaction here is the one a new connection (a new lock session, on advisory) runs
first: the statements of the hand-over, planned once and rolled back (docs/postgresql.md).
Another session makes a statement of that transaction wait, and the server is frozen at
that moment:
- the lease backend prepares its release inside the transaction, so a table held in SHARE
  mode (which refuses the release's row-exclusive lock) stops it there;
- the advisory backend prepared its statements when the session opened, and its planning
  writes this node's member row: an uncommitted row with the same key stops it there.
"""

from __future__ import annotations

import asyncio
import signal

import asyncpg
import pytest

from leaderd.backends import BackendUnavailable, Candidate, backend_from_url
from tests.backends.postgres.helpers import admin, opened, unique, url
from tests.support.backend_calls import ask
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.postgres

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
TIMEOUT = 5.0  # time for a loaded machine to connect and reach the wait before it
FROZEN_FOR = 20.0  # the request must end long before the server wakes

WAITING_FOR_A_LOCK = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'"
)


async def _stop_the_planning(holder: asyncpg.Connection, scheme: str, table: str, e: str) -> None:
    """In ``holder``'s open transaction, what B's planning transaction waits for."""
    if scheme == "postgresql":
        await holder.execute(f'LOCK TABLE "{table}" IN SHARE MODE')
        return
    await holder.execute(
        f'INSERT INTO "{table}_members" (election, node_id, instance, ttl, heard_at) '
        "VALUES ($1, $2, $3, 15, now())",
        e, B.node_id, B.instance,
    )  # fmt: skip


async def _waits_for_a_lock(watcher: asyncpg.Connection, app: str) -> bool:
    """Whether, within 10 s, a session of ``app`` waits for a lock."""
    for _ in range(1000):
        if await watcher.fetchval(WAITING_FOR_A_LOCK, app):
            return True
        await asyncio.sleep(0.01)
    return False


async def test_a_request_frozen_inside_a_transaction_ends_within_its_timeout(
    pg: PgServer, scheme: str
) -> None:
    e, app, table = unique(), unique("leaderd-frozen"), unique("t")
    u = url(pg, scheme, table=table, application_name=app)
    async with opened(u, e) as a, admin(pg) as holder, admin(pg) as watcher:
        await ask(a, e, A, ttl=15, timeout=5)  # the table exists, and A holds the lease
        fresh = backend_from_url(u)  # its first request opens a connection, and plans
        locked = holder.transaction()
        await locked.start()
        await _stop_the_planning(holder, scheme, table, e)
        request = asyncio.ensure_future(ask(fresh, e, B, ttl=15, timeout=TIMEOUT))
        try:
            assert await _waits_for_a_lock(watcher, app), (
                "the new connection's planning never waited for the lock"
            )
            pg.signal_all(signal.SIGSTOP)
            done, _ = await asyncio.wait({request}, timeout=FROZEN_FOR)
            assert request in done, "the request waited for the frozen server"
            with pytest.raises(BackendUnavailable, match=r"timed out after 5s"):
                request.result()
        finally:
            pg.signal_all(signal.SIGCONT)
            await asyncio.gather(request, return_exceptions=True)
            await locked.rollback()
            await fresh.close()
