"""The fence function: the PostgreSQL server itself refuses a stale leader's write
(docs/fencing.md). Each test writes through an application's own transaction on the real
server the suite starts; the races are forced with held locks, never with timing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from leaderd.backends import Backend, Candidate
from leaderd.backends.asks import Ask, Release
from tests.backends.postgres.helpers import admin, opened, unique
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.postgres

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
STALE_TERM = "LD001"

APP_TABLE = "CREATE TABLE {app} (id serial PRIMARY KEY, term bigint NOT NULL, note text)"
# The application's fenced write: the fence and the write in one transaction.
FENCED_INSERT = "INSERT INTO {app} (term, note) SELECT {f}($1, $2), $3"
WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'"
)


class Store:
    """One lease table with its fence function, and an application table beside it."""

    def __init__(self, pg: PgServer) -> None:
        self.pg = pg
        self.table, self.election, self.app = unique("fence"), unique(), unique("app")
        self.function = f"{self.table}_fence"

    def url(self, application_name: str = "leaderd") -> str:
        return self.pg.dsn(table=self.table, application_name=application_name)

    async def write(self, conn: asyncpg.Connection, term: int, note: str) -> None:
        sql = FENCED_INSERT.format(app=self.app, f=self.function)
        async with conn.transaction():
            await conn.execute(sql, self.election, term, note)

    async def notes(self, conn: asyncpg.Connection) -> list[str]:
        rows = await conn.fetch(f"SELECT note FROM {self.app} ORDER BY id")
        return [r["note"] for r in rows]


@pytest.fixture
async def store(pg_server: PgServer) -> AsyncIterator[Store]:
    s = Store(pg_server)
    async with admin(pg_server) as conn:
        await conn.execute(APP_TABLE.format(app=s.app))
        yield s
        await conn.execute(f"DROP TABLE IF EXISTS {s.app}, {s.table} CASCADE")
        await conn.execute(f"DROP FUNCTION IF EXISTS {s.function}(text, bigint)")
        await conn.execute(f"DROP FUNCTION IF EXISTS {s.app}_fenced()")


async def lead(backend: Backend, election: str, who: Candidate, ttl: float = 30) -> int:
    lease = await backend.acquire_or_renew(Ask(election, who, ttl, 5))
    assert lease.held_by(who), lease
    return lease.term


async def refused(store: Store, conn: asyncpg.Connection, term: int) -> asyncpg.PostgresError:
    with pytest.raises(asyncpg.PostgresError) as info:
        await store.write(conn, term, "stale")
    assert info.value.sqlstate == STALE_TERM, info.value
    return info.value


async def test_a_stale_leaders_write_after_a_hand_over_is_refused_the_new_leaders_succeeds(
    store: Store,
) -> None:
    e = store.election
    async with opened(store.url(), e) as a, opened(store.url(), e) as b, admin(store.pg) as app:
        old = await lead(a, e, A)
        await store.write(app, old, "by node-a")
        await a.release(Release(e, A, old))
        new = await lead(b, e, B)
        assert new > old
        error = await refused(store, app, old)
        assert f"not led with term {old}" in str(error)
        await store.write(app, new, "by node-b")
        assert await store.notes(app) == ["by node-a", "by node-b"]


async def test_a_lease_expired_on_the_servers_clock_fences_its_holder_even_before_a_takeover(
    store: Store,
) -> None:
    e = store.election
    async with opened(store.url(), e) as a, admin(store.pg) as app:
        term = await lead(a, e, A, ttl=0.5)
        await store.write(app, term, "in time")
        await asyncio.sleep(0.6)  # past the lease's end on the server's clock, nobody took it
        assert (await a.observe(e)).expired
        error = await refused(store, app, term)
        assert "expired" in (error.detail or "")
        assert await store.notes(app) == ["in time"]


async def test_a_released_lease_and_an_unknown_election_fence_every_term(store: Store) -> None:
    e = store.election
    async with opened(store.url(), e) as a, admin(store.pg) as app:
        term = await lead(a, e, A)
        await a.release(Release(e, A, term))
        assert "released" in ((await refused(store, app, term)).detail or "")
        store.election = unique()
        assert "no such election" in ((await refused(store, app, term)).detail or "")


async def test_a_write_holding_the_fence_commits_before_the_release_which_waits_for_it(
    store: Store,
) -> None:
    e, name = store.election, unique("holder")
    url = store.url(application_name=name)
    async with opened(url, e) as a, opened(store.url(), e) as b, admin(store.pg) as app:
        old = await lead(a, e, A)
        async with admin(store.pg) as watcher:
            tx = app.transaction()
            await tx.start()
            await app.execute(FENCED_INSERT.format(app=store.app, f=store.function), e, old, "held")
            release = asyncio.create_task(a.release(Release(e, A, old)))
            # The release is blocked by the fence's share lock on the lease row.
            assert await poll(lambda: watcher.fetchval(WAITING, name), 1)
            assert not release.done()
            await tx.commit()
            await release
        new = await lead(b, e, B)
        assert await store.notes(app) == ["held"]
        await refused(store, app, old)
        await store.write(app, new, "after")


async def test_a_write_racing_a_release_that_holds_the_row_waits_then_fails(
    store: Store,
) -> None:
    """The release locks the lease row and is then held on the history row (a lock the test
    takes first): the application's fence waits for the release, then refuses."""
    e, releaser, writer = store.election, unique("releaser"), unique("writer")
    history = f"{store.table}_history"
    async with opened(store.url(application_name=releaser), e) as a, admin(store.pg) as held:
        old = await lead(a, e, A)
        async with admin(store.pg) as watcher, admin(store.pg) as app:
            await app.execute("SELECT set_config('application_name', $1, false)", writer)
            hold = held.transaction()
            await hold.start()
            await held.execute(f"SELECT 1 FROM {history} WHERE election = $1 FOR UPDATE", e)
            release = asyncio.create_task(a.release(Release(e, A, old)))
            assert await poll(lambda: watcher.fetchval(WAITING, releaser), 1)
            write = asyncio.create_task(store.write(app, old, "racing"))
            assert await poll(lambda: watcher.fetchval(WAITING, writer), 1)
            assert not write.done()
            await hold.commit()
            await release
            with pytest.raises(asyncpg.PostgresError) as info:
                await write
            assert info.value.sqlstate == STALE_TERM
            assert await store.notes(app) == []


TRIGGER = """
CREATE FUNCTION {app}_fenced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {f}('{election}', NEW.term);
    RETURN NEW;
END $$;
CREATE TRIGGER fenced BEFORE INSERT OR UPDATE ON {app}
    FOR EACH ROW EXECUTE FUNCTION {app}_fenced()
"""

# A plain write to a table that carries the writer's term, fenced by the table itself.
GUARDS = {
    "trigger": TRIGGER,
    "check": "ALTER TABLE {app} ADD CONSTRAINT fenced CHECK ({f}('{election}', term) = term)",
}


@pytest.mark.parametrize("guard", sorted(GUARDS))
async def test_a_trigger_or_a_check_constraint_fences_every_plain_write(
    store: Store, guard: str
) -> None:
    e, insert = store.election, f"INSERT INTO {store.app} (term, note) VALUES ($1, $2)"
    async with opened(store.url(), e) as a, opened(store.url(), e) as b, admin(store.pg) as app:
        await app.execute(GUARDS[guard].format(app=store.app, f=store.function, election=e))
        old = await lead(a, e, A)
        await app.execute(insert, old, "a")
        await a.release(Release(e, A, old))
        new = await lead(b, e, B)
        with pytest.raises(asyncpg.PostgresError) as info:
            await app.execute(insert, old, "x")
        assert info.value.sqlstate == STALE_TERM
        await app.execute(insert, new, "b")
        assert await store.notes(app) == ["a", "b"]


async def test_an_older_installation_gains_the_function_on_open(store: Store) -> None:
    e = store.election
    async with admin(store.pg) as owner:
        async with opened(store.url(), e):
            pass
        # An older leaderd's installation: every table, no function.
        await owner.execute(f"DROP FUNCTION {store.function}(text, bigint)")
        async with opened(store.url(), e) as a, admin(store.pg) as app:
            assert await function_exists(owner, store.function)
            await store.write(app, await lead(a, e, A), "fenced")


async def test_a_role_that_may_not_create_the_function_only_gets_a_warning(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Leader election never calls the fence: without it, elections go on."""
    e, role = store.election, unique("limited")
    async with admin(store.pg) as owner:
        await owner.execute(f"CREATE ROLE {role} LOGIN; GRANT CREATE ON SCHEMA public TO {role}")
        # A role may create tables but no PL/pgSQL function (a site's hardening).
        await owner.execute("REVOKE USAGE ON LANGUAGE plpgsql FROM PUBLIC")
        try:
            limited = store.pg.dsn(user=role, table=store.table)
            with caplog.at_level(logging.WARNING, logger="leaderd.backends.postgresql"):
                async with opened(limited, e) as b:
                    assert (await b.acquire_or_renew(Ask(e, B, 30, 5))).held_by(B)
            assert "may not create the fence function" in caplog.text
            assert not await function_exists(owner, store.function)
        finally:
            await owner.execute("GRANT USAGE ON LANGUAGE plpgsql TO PUBLIC")
            await owner.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


async def test_the_fence_is_named_leaderd_fence_beside_the_default_table(
    pg_server: PgServer,
) -> None:
    schema = unique("s")
    async with admin(pg_server) as owner:
        await owner.execute(f"CREATE SCHEMA {schema}")
        try:
            async with opened(pg_server.dsn(schema=schema), "default"):
                assert await function_exists(owner, f"{schema}.leaderd_fence")
            # An application's role needs EXECUTE, which PUBLIC does not have.
            grantees = await owner.fetchval(
                "SELECT proacl::text FROM pg_proc WHERE oid = $1::regprocedure",
                f"{schema}.leaderd_fence(text, bigint)",
            )
            assert not any(g.startswith("=") for g in grantees.strip("{}").split(",")), grantees
        finally:
            await owner.execute(f"DROP SCHEMA {schema} CASCADE")


async def function_exists(conn: asyncpg.Connection, name: str) -> bool:
    return bool(
        await conn.fetchval("SELECT to_regprocedure($1) IS NOT NULL", f"{name}(text, bigint)")
    )


async def poll(count: Callable[[], Awaitable[object]], timeout: float) -> bool:
    """Until the awaited ``count()`` is positive, every 10 ms for up to ``timeout`` s."""
    for _ in range(int(timeout / 0.01)):
        if await count():
            return True
        await asyncio.sleep(0.01)
    return False
