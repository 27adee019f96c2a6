"""postgresql+advisory test helpers: the lock's holders and waiters as pg_locks shows them."""

from __future__ import annotations

import asyncio
from typing import Any

from leaderd.backends import Candidate
from leaderd.backends.postgres.advisory import advisory_key
from tests.backends.postgres.helpers import unique
from tests.support.pgserver import PgServer

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
HOLDER_SQL = """
SELECT a.pid, a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND ((l.classid::int8 << 32) | l.objid::int8) = $1
"""


def url(pg: PgServer, **params: str) -> str:
    return pg.dsn(scheme="postgresql+advisory", table=unique("adv"), **params)


async def lock_pids(conn: Any, election: str) -> list[int]:
    return [r["pid"] for r in await conn.fetch(HOLDER_SQL, advisory_key(election))]


async def blocked(other: Any, election: str, count: int = 1) -> None:
    """Wait until ``count`` sessions wait for the election's lock (a loaded machine may take
    a while to open a waiter's session). A waiter is asked with the engine's ``min_term``
    (its high-water + 1): without it, the NOTIFY of the holder's own acquisition, delivered
    once the wait began, ends the wait as news of a new leader."""
    sql = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
        "AND objsubid = 1 AND ((classid::int8 << 32) | objid::int8) = $1"
    )
    give_up = asyncio.get_running_loop().time() + 30
    while asyncio.get_running_loop().time() < give_up:
        if await other.fetchval(sql, advisory_key(election)) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} waiter(s) never blocked in the lock of {election}")
