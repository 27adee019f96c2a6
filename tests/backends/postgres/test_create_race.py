"""Daemons that start together race to create their tables. The loser's
``CREATE TABLE IF NOT EXISTS`` finds no table (the winner's is not committed yet), then waits
for the winner's row in the catalog, and fails once the winner commits. The race is forced:
another session creates the table in a transaction held open until the loser waits on it."""

from __future__ import annotations

import asyncio

import pytest

from leaderd.backends import BackendFatal, backend_from_url
from leaderd.backends.postgres import lease, records
from leaderd.backends.postgres.jobs import PostgresJobStore
from leaderd.backends.postgres.settings import PgSettings
from tests.backends.postgres.helpers import admin, unique
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.postgres

WAITING = """SELECT count(*) FROM pg_stat_activity
    WHERE application_name = $1 AND wait_event_type = 'Lock' AND query LIKE '%CREATE TABLE%'"""


def _contested(what: str, settings: PgSettings) -> tuple[str, str]:
    """The table raced for, and the statement the winner runs: the very one the loser runs."""
    if what == "jobs":
        jobs = PostgresJobStore(settings)
        return jobs._table, jobs._sql["create"]
    if what == "lease":
        return settings.qualified_table, lease._SCHEMA.format(t=settings.qualified_table)
    members = records.tables(settings)["m"]
    return members, records._CREATE.split(";")[0].format(**records.tables(settings))


async def _open_and_close(what: str, url: str) -> None:
    opened = PostgresJobStore.from_url(url) if what == "jobs" else backend_from_url(url)
    try:
        await (opened.open() if isinstance(opened, PostgresJobStore) else opened.open(["default"]))
    finally:
        await opened.close()


@pytest.mark.parametrize("what", ["jobs", "lease", "members"])
async def test_the_daemon_that_loses_the_race_to_create_a_table_opens(
    pg_server: PgServer, what: str
) -> None:
    name = unique("loser")
    url = pg_server.dsn(table=unique("race"), application_name=name)
    settings = PgSettings.from_url(url, default_table=PostgresJobStore.DEFAULT_TABLE)
    table, create = _contested(what, settings)
    async with admin(pg_server) as winner, admin(pg_server) as watcher:
        held = winner.transaction()
        await held.start()
        if what == "members":  # the lease table first, uncontested: the race is on the next
            await watcher.execute(lease._SCHEMA.format(t=settings.qualified_table))
        await winner.execute(create)
        opening = asyncio.create_task(_open_and_close(what, url))
        while not await watcher.fetchval(WAITING, name):  # the loser waits on the winner
            assert not opening.done(), opening.exception()
            await asyncio.sleep(0.01)
        await held.commit()
        await asyncio.wait_for(opening, 10)  # the loser's unique_violation is no error
        assert await watcher.fetchval("SELECT to_regclass($1) IS NOT NULL", table)


async def test_a_type_that_holds_the_jobs_tables_name_is_an_error_not_a_lost_race(
    pg_server: PgServer,
) -> None:
    """The same error as a lost race (``type ... already exists``), with no table after it:
    the store must not open as if the winner's table were there."""
    url = pg_server.dsn(table=unique("taken"))
    store = PostgresJobStore.from_url(url)
    async with admin(pg_server) as conn:
        await conn.execute(f"CREATE TYPE {store._table} AS ENUM ('a')")
    with pytest.raises(BackendFatal, match="already exists"):
        await store.open()
    await store.close()
