"""The advisory lock's fence, as docs/fencing.md documents it ("Advisory lock"): the
statement is read from the page itself, so the page and this test cannot drift apart. An
application's transaction on the real server the suite starts runs it before its write; a
stale leader's write is refused, the new leader's succeeds. Races are forced with held
locks and a terminated session, never with timing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from leaderd.backends import Candidate
from tests.backends.postgres.helpers import admin, opened, session_pid, unique, until
from tests.backends.postgres.test_fence import poll
from tests.support.backend_calls import ask, release
from tests.support.daemons import REPO
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.postgres

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
SECTION = "## Advisory lock (`postgresql+advisory://`)"
WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'"
)


def documented_fence() -> str:
    """The statement docs/fencing.md gives for the advisory lock, as written there."""
    page = (REPO / "docs" / "fencing.md").read_text()
    section = page.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return section.split("```sql\n", 1)[1].split("```", 1)[0]


class Refused(Exception):
    """The fence returned no row: the application rolls its write back."""


class App:
    """An application writing to its own table, fenced by the documented statement, with the
    lease's companion table ``table`` and its election ``election``."""

    def __init__(self, pg: PgServer) -> None:
        self.pg, self.table, self.election, self.notes_table = (
            pg,
            unique("adv"),
            unique(),
            unique("app"),
        )
        documented = documented_fence()
        assert "leaderd_advisory" in documented and "'default'" in documented, documented
        self.fence = documented.replace("leaderd_advisory", self.table).replace(
            "'default'", f"'{self.election}'"
        )

    def url(self, **params: str) -> str:
        return self.pg.dsn(scheme="postgresql+advisory", table=self.table, **params)

    async def fenced(self, conn: asyncpg.Connection, term: int, note: str) -> None:
        """The documented check, then the write, in one transaction."""
        if await conn.fetchrow(self.fence, term) is None:
            raise Refused(f"term {term}")
        await conn.execute(
            f"INSERT INTO {self.notes_table} (term, note) VALUES ($1, $2)", term, note
        )

    async def write(self, conn: asyncpg.Connection, term: int, note: str) -> None:
        async with conn.transaction():
            await self.fenced(conn, term, note)

    async def notes(self, conn: asyncpg.Connection) -> list[str]:
        return [
            r["note"] for r in await conn.fetch(f"SELECT note FROM {self.notes_table} ORDER BY id")
        ]


@pytest.fixture
async def app(pg_server: PgServer) -> AsyncIterator[App]:
    a = App(pg_server)
    async with admin(pg_server) as conn:
        await conn.execute(
            f"CREATE TABLE {a.notes_table} (id serial PRIMARY KEY, term bigint, note text)"
        )
        yield a
        tables = [a.notes_table, *(f"{a.table}{suffix}" for suffix in ("", "_history", "_members"))]
        await conn.execute(f"DROP TABLE IF EXISTS {', '.join(tables)} CASCADE")


async def test_a_stale_leaders_write_after_a_hand_over_is_refused_the_new_leaders_succeeds(
    app: App,
) -> None:
    e = app.election
    async with opened(app.url(), e) as a, opened(app.url(), e) as b, admin(app.pg) as conn:
        old = (await ask(a, e, A, ttl=30)).term
        await app.write(conn, old, "by node-a")
        await release(a, e, A, old)
        new = await ask(b, e, B, ttl=30)
        assert new.held_by(B) and new.term > old
        with pytest.raises(Refused):
            await app.write(conn, old, "stale")
        await app.write(conn, new.term, "by node-b")
        assert await app.notes(conn) == ["by node-a", "by node-b"]


async def test_a_holder_whose_lock_session_ended_is_fenced_before_anyone_claims(
    app: App,
) -> None:
    """The companion row still names the holder with an unexpired lease, but the lock is no
    longer its session's: the statement's pg_locks clause refuses it."""
    e = app.election
    async with opened(app.url(), e) as a, admin(app.pg) as conn:
        term = (await ask(a, e, A, ttl=30)).term
        await app.write(conn, term, "in time")
        await conn.execute("SELECT pg_terminate_backend($1)", session_pid(a, e))
        assert await until(lambda: a._sessions[e].conn is None, 10)  # type: ignore[attr-defined]
        row = await conn.fetchrow(
            f"SELECT holder, term, expires_at > clock_timestamp() AS live FROM {app.table} "
            "WHERE election = $1", e,
        )  # fmt: skip
        assert tuple(row) == (A.node_id, term, True)
        with pytest.raises(Refused):
            await app.write(conn, term, "session gone")
        assert await app.notes(conn) == ["in time"]


async def test_a_write_holding_the_fence_commits_before_the_release_which_waits_for_it(
    app: App,
) -> None:
    e, name = app.election, unique("holder")
    async with opened(app.url(application_name=name), e) as a, opened(app.url(), e) as b, \
            admin(app.pg) as conn, admin(app.pg) as watcher:  # fmt: skip
        old = (await ask(a, e, A, ttl=30)).term
        tx = conn.transaction()
        await tx.start()
        await app.fenced(conn, old, "held")
        releasing = asyncio.create_task(release(a, e, A, old))
        # The release's write to the companion row waits for the fence's share lock.
        assert await poll(lambda: watcher.fetchval(WAITING, name), 10)
        assert not releasing.done()
        await tx.commit()
        await releasing
        new = await ask(b, e, B, ttl=30)
        assert new.held_by(B)
        with pytest.raises(Refused):
            await app.write(conn, old, "stale")
        await app.write(conn, new.term, "after")
        assert await app.notes(conn) == ["held", "after"]
