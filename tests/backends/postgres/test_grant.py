"""postgresql:// one-write hand-over, what is PostgreSQL's own (the rules every backend that
grants keeps are tests/backends/test_grant.py): an older leaderd's members table gains the
column the release's grant reads."""

from __future__ import annotations

import pytest

from leaderd.backends import Candidate
from tests.backends.postgres.helpers import admin, opened, unique
from tests.support.backend_calls import ask
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.postgres

A = Candidate("node-a", "10.0.0.1:80")
TTL = 4.0


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
