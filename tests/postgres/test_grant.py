"""postgresql:// one-write hand-over (docs/algorithm.md, "One-write hand-over"): the release
grants the lease to the freshest live campaigning member of another node id, in its own
transaction, and the member hears of it by NOTIFY with the heartbeat it counts from."""

from __future__ import annotations

import asyncio

import pytest

from leaderd.backends import Candidate
from tests.backend_calls import ask, release
from tests.grants import heard, not_granted_back, wait_grant
from tests.pgserver import PgServer
from tests.postgres.helpers import admin, opened, unique

pytestmark = pytest.mark.postgres

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
C = Candidate("node-c", "10.0.0.3:80")
TTL = 4.0


async def test_a_release_grants_the_freshest_standby_the_next_term(pg_server: PgServer) -> None:
    u, e = pg_server.dsn(table=unique("t")), unique()
    async with opened(u, e) as a, opened(u, e) as b, opened(u, e) as c:
        held = await ask(a, e, A, ttl=TTL, timeout=5)
        await ask(c, e, C, ttl=TTL, timeout=5)
        b_heard = heard(await ask(b, e, B, ttl=TTL, timeout=5), B)  # the freshest
        await release(a, e, A, held.term, grant=True)
        grant = await wait_grant(b, e)
        assert grant.heard_at == b_heard and grant.lease.held_by(B)
        assert grant.lease.term == held.term + 1 and grant.lease.expires_in == TTL
        seen = await c.observe(e)
        assert seen.holder == B.node_id and seen.term == held.term + 1
        assert seen.expires_in is not None and TTL - 1.0 < seen.expires_in <= TTL
        assert seen.version == grant.lease.version  # what watchers time a takeover by
        # B's own renewal keeps the granted term; history tells the hand-over.
        renewed = await ask(b, e, B, ttl=TTL, timeout=5)
        assert renewed.held_by(B) and renewed.term == grant.lease.term
        records = await c.history(e, 10)
        assert [(r.term, r.holder, r.end_reason) for r in records] == [
            (held.term + 1, B.node_id, None),
            (held.term, A.node_id, "released"),
        ]


async def test_no_grant_to_a_member_cooling_down_stale_or_of_the_same_node_id(
    pg_server: PgServer,
) -> None:
    u, e = pg_server.dsn(table=unique("t")), unique()
    twin = Candidate(A.node_id, A.address)  # the same node id, another process
    async with opened(u, e) as a, opened(u, e) as b, opened(u, e) as c, opened(u, e) as d:
        held = await ask(a, e, A, ttl=TTL, timeout=5)
        await ask(c, e, C, ttl=1.0, timeout=5)  # stale after half its ttl
        await asyncio.sleep(0.6)
        await b.observe(e, B, TTL)  # cooling down: heard, not campaigning
        await ask(d, e, twin, ttl=TTL, timeout=5)
        await release(a, e, A, held.term, grant=True)
        released = await b.observe(e)
        assert released.holder is None and released.term == held.term


async def test_a_release_without_grant_or_with_a_reservation_grants_nothing(
    pg_server: PgServer,
) -> None:
    u, e = pg_server.dsn(table=unique("t")), unique()
    async with opened(u, e) as a, opened(u, e) as b:
        held = await ask(a, e, A, ttl=TTL, timeout=5)
        await ask(b, e, B, ttl=TTL, timeout=5)
        await release(a, e, A, held.term)
        assert (await b.observe(e)).holder is None
        again = await ask(a, e, A, ttl=TTL, timeout=5)
        await release(a, e, A, again.term, reserve_for=C.node_id, ttl=TTL, grant=True)
        reserved = await b.observe(e)
        assert reserved.holder is None and reserved.reserved_for == C.node_id


async def test_members_of_an_older_leaderd_gain_the_newer_columns(pg_server: PgServer) -> None:
    """campaigning, then priority and health (docs/algorithm.md, "Who leads")."""
    table, e = unique("t"), unique()
    async with admin(pg_server) as conn:
        await conn.execute(
            f"CREATE TABLE {table}_members (election text NOT NULL, node_id text NOT NULL, "
            "instance text NOT NULL, address text NOT NULL DEFAULT '', version text NOT NULL "
            "DEFAULT '', ttl float8 NOT NULL, heard_at timestamptz NOT NULL, "
            "PRIMARY KEY (election, node_id, instance))"
        )
    async with opened(pg_server.dsn(table=table), e) as a:
        assert (await ask(a, e, A, ttl=TTL, timeout=5)).held_by(A)
    async with admin(pg_server) as conn:
        assert await conn.fetchval(f"SELECT bool_and(campaigning) FROM {table}_members") is True
        row = await conn.fetchrow(f"SELECT priority, health FROM {table}_members")
        assert tuple(row) == (A.priority, "")


async def test_a_leader_that_released_is_not_granted_the_lease_back(pg_server: PgServer) -> None:
    u, e = pg_server.dsn(table=unique("t")), unique()
    async with opened(u, e) as a, opened(u, e) as b:
        await not_granted_back(a, b, e, TTL)
