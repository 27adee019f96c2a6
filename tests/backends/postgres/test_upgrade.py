"""Tables made by an older leaderd (no instance, no version) are upgraded in place."""

from __future__ import annotations

import asyncio

import pytest

from leaderd.backends import BackendFatal, Candidate, backend_from_url
from tests.backends.postgres.helpers import admin, opened, unique
from tests.support.backend_calls import ask
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.postgres

A = Candidate("node-a", "10.0.0.1:80")  # the upgraded daemon: the old one's node id
B = Candidate("node-b", "10.0.0.2:80")

OLD_LEASE = """
CREATE TABLE {t} (election text PRIMARY KEY, holder text, address text NOT NULL DEFAULT '',
    term bigint NOT NULL, acquired_at timestamptz, renewed_at timestamptz,
    expires_at timestamptz NOT NULL);
INSERT INTO {t} VALUES ('{e}', 'node-a', '', 7, now(), now(), now() + interval '1 s')
"""
# How the previous leaderd renewed: it moved expires_at, and knew no version column.
OLD_RENEWAL = "UPDATE {t} SET renewed_at = now(), expires_at = now() + interval '1 s'"

OLD_ADVISORY = """
CREATE TABLE {t} (election text PRIMARY KEY, lock_key bigint NOT NULL, holder text,
    address text NOT NULL DEFAULT '', term bigint NOT NULL, acquired_at timestamptz,
    released_at timestamptz, pid integer, expires_at timestamptz);
INSERT INTO {t} VALUES ('{e}', 0, NULL, '', 7, now(), now(), NULL, now())
"""


async def test_an_old_lease_table_gains_instance_and_version(pg_server: PgServer) -> None:
    t, e = unique("old"), unique()
    async with admin(pg_server) as other:
        await other.execute(OLD_LEASE.format(t=t, e=e))
        async with opened(pg_server.dsn(table=t), e) as a, opened(pg_server.dsn(table=t), e) as b:
            seen = await b.observe(e)
            assert (seen.holder, seen.instance, seen.term) == ("node-a", "", 7)
            # An old daemon still renewing (a rolling upgrade) moves the version.
            await other.execute(OLD_RENEWAL.format(t=t))
            assert (await b.observe(e)).version != seen.version
            # Its node id in a new process is another holder: it waits for the lease to end.
            assert not (await ask(a, e, A, ttl=15, timeout=5)).held_by(A)
            await asyncio.sleep(1.1)
            expired = await b.observe(e)
            assert expired.expired
            taken = await ask(a, e, A, ttl=15, timeout=5, takeover=expired.version)
            assert taken.held_by(A) and taken.term == 8


async def test_an_old_advisory_table_gains_instance_session_start_and_version(
    pg_server: PgServer,
) -> None:
    t, e = unique("old"), unique()
    u = pg_server.dsn(scheme="postgresql+advisory", table=t)
    async with admin(pg_server) as other:
        await other.execute(OLD_ADVISORY.format(t=t, e=e))
        async with opened(u, e) as a:
            lease = await ask(a, e, A, ttl=15, timeout=5)
            assert lease.held_by(A) and lease.term == 8 and lease.version
        columns = await other.fetchval(
            "SELECT array_agg(column_name::text ORDER BY column_name) "
            "FROM information_schema.columns WHERE table_name = $1",
            t,
        )
        assert {"instance", "backend_start", "version", "reserved_for", "reserved_until"} <= set(
            columns
        )


async def test_an_upgrade_the_role_may_not_make_is_fatal_and_says_what_to_run(
    pg_server: PgServer,
) -> None:
    t, e, role = unique("old"), unique(), unique("limited")
    async with admin(pg_server) as other:
        await other.execute(OLD_LEASE.format(t=t, e=e))
        await other.execute(
            f"CREATE ROLE {role} LOGIN; GRANT SELECT, INSERT, UPDATE ON {t} TO {role}"
        )
        try:
            backend = backend_from_url(pg_server.dsn(user=role, table=t))
            with pytest.raises(
                BackendFatal, match=r"as the table's owner run: ALTER TABLE"
            ) as info:
                await backend.open([e])
            assert "instance, version" in str(info.value) and "\n" not in str(info.value)
            await backend.close()
        finally:
            await other.execute(f"DROP TABLE {t}; DROP ROLE {role}")


async def test_records_tables_the_role_may_not_create_are_fatal_and_say_what_to_run(
    pg_server: PgServer,
) -> None:
    """An older leaderd's up-to-date lease table, in a schema where this role may not create
    the members and history tables: one line that says what to run."""
    schema, t, e, role = unique("s"), unique("old"), unique(), unique("limited")
    async with admin(pg_server) as other:
        await other.execute(f"CREATE SCHEMA {schema}")
        async with opened(pg_server.dsn(table=t, schema=schema), e):
            pass  # the tables, as this leaderd makes them
        await other.execute(
            f"DROP TABLE {schema}.{t}_members, {schema}.{t}_history; CREATE ROLE {role} LOGIN; "
            f"GRANT USAGE ON SCHEMA {schema} TO {role}; "
            f"GRANT SELECT, INSERT, UPDATE ON {schema}.{t} TO {role}"
        )
        try:
            backend = backend_from_url(pg_server.dsn(user=role, table=t, schema=schema))
            with pytest.raises(
                BackendFatal, match=r"as the schema's owner run: CREATE TABLE"
            ) as info:
                await backend.open([e])
            assert f"{t}_history" in str(info.value) and "\n" not in str(info.value)
            await backend.close()
        finally:
            await other.execute(f"DROP SCHEMA {schema} CASCADE; DROP ROLE {role}")
