"""The SQLite lease file refuses a stale leader's write (docs/fencing.md): the statement and
transaction of examples/fencing/sqlite_fence.py, on a real file beside real backends. The
races are forced by a held write lock, never by timing."""

from __future__ import annotations

import asyncio
import importlib.util
import sqlite3
from pathlib import Path
from types import ModuleType

import pytest

from leaderd.backends import Candidate
from leaderd.backends.asks import Ask, Release
from leaderd.backends.sqlite.backend import SQLiteBackend
from leaderd.backends.sqlite.schema import RELEASE
from leaderd.clock import boottime

from ..conftest import LONG_TTL, SHORT_TTL, Opener

E = "default"
A, B = Candidate("node-a"), Candidate("node-b")
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "fencing" / "sqlite_fence.py"
# Long enough for a blocked request to show it is blocked; the lock, not this, orders them.
BLOCKED_FOR = 0.3


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sqlite_fence", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fence = load_example()


class App:
    """The application: its own database, with the lease file attached."""

    def __init__(self, tmp_path: Path) -> None:
        self.conn: sqlite3.Connection = fence.connect(
            str(tmp_path / "app.db"), str(tmp_path / "leaderd.db")
        )

    def write(self, term: int, note: str) -> None:
        with fence.fenced(self.conn, E, term):
            self.conn.execute("INSERT INTO fenced_log (term, note) VALUES (?, ?)", (term, note))

    def refused(self, term: int) -> None:
        with pytest.raises(fence.StaleTerm, match=f"not led with term {term}"):
            self.write(term, "stale")

    def notes(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT note FROM fenced_log ORDER BY rowid")]


@pytest.fixture
async def pair(opened: Opener, tmp_path: Path) -> tuple[SQLiteBackend, SQLiteBackend, App]:
    """Two daemons' backends on one lease file, and the application beside them."""
    a, b = await opened(tmp_path / "leaderd.db"), await opened(tmp_path / "leaderd.db")
    return a, b, App(tmp_path)


async def hand_over(a: SQLiteBackend, b: SQLiteBackend, old: int) -> int:
    """node-a releases ``old``, node-b leads: its term."""
    await a.release(Release(E, A, old))
    return await lead(b, B)


async def lead(backend: SQLiteBackend, who: Candidate, ttl: float = LONG_TTL) -> int:
    lease = await backend.acquire_or_renew(Ask(E, who, ttl, 10))
    assert lease.held_by(who), lease
    return lease.term


def holder(path: Path) -> str | None:
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT holder FROM leaderd_lease WHERE election = ?", (E,))
        found: str | None = row.fetchone()[0]
        return found


async def test_a_stale_leaders_write_after_a_hand_over_is_refused_the_new_leaders_succeeds(
    pair: tuple[SQLiteBackend, SQLiteBackend, App],
) -> None:
    a, b, app = pair
    old = await lead(a, A)
    app.write(old, "by node-a")
    new = await hand_over(a, b, old)
    app.refused(old)
    app.write(new, "by node-b")
    assert app.notes() == ["by node-a", "by node-b"]


async def test_a_lease_lapsed_on_clock_boottime_fences_its_holder_before_any_takeover(
    opened: Opener, tmp_path: Path
) -> None:
    a = await opened(tmp_path / "leaderd.db")
    app = App(tmp_path)
    term = await lead(a, A, ttl=SHORT_TTL)
    app.write(term, "in time")
    await asyncio.sleep(SHORT_TTL * 1.5)
    assert holder(tmp_path / "leaderd.db") == "node-a"  # still named: nobody took it over
    app.refused(term)
    assert app.notes() == ["in time"]


async def test_a_write_holding_the_lock_commits_before_the_release_which_waits_for_it(
    pair: tuple[SQLiteBackend, SQLiteBackend, App], tmp_path: Path
) -> None:
    a, b, app = pair
    old = await lead(a, A)
    with fence.fenced(app.conn, E, old):
        app.conn.execute("INSERT INTO fenced_log (term, note) VALUES (?, 'held')", (old,))
        release = asyncio.create_task(a.release(Release(E, A, old)))
        await asyncio.sleep(BLOCKED_FOR)
        assert not release.done() and holder(tmp_path / "leaderd.db") == "node-a"
    await release  # the commit let it through
    assert holder(tmp_path / "leaderd.db") is None
    new = await lead(b, B)
    app.refused(old)
    app.write(new, "after")
    assert app.notes() == ["held", "after"]


async def test_a_write_racing_a_release_that_holds_the_lock_waits_then_fails(
    opened: Opener, tmp_path: Path
) -> None:
    a = await opened(tmp_path / "leaderd.db")
    app = App(tmp_path)
    old = await lead(a, A)
    releaser = sqlite3.connect(tmp_path / "leaderd.db", isolation_level=None)
    releaser.execute("BEGIN IMMEDIATE")  # leaderd's release, held between its write and commit
    params = {"election": E, "holder": A.node_id, "instance": A.instance, "term": old,
              "version": "", "reserve_for": "", "reserve_ttl": 0.0, "wall": "",
              "now": boottime()}  # fmt: skip
    assert releaser.execute(RELEASE.format(table="leaderd_lease"), params).rowcount == 1
    # The application's connection in a thread of its own, which the lock blocks.
    write = asyncio.create_task(asyncio.to_thread(lambda: App(tmp_path).write(old, "racing")))
    await asyncio.sleep(BLOCKED_FOR)
    assert not write.done()  # it waits for the release's write lock
    releaser.execute("COMMIT")
    with pytest.raises(fence.StaleTerm):
        await write
    assert app.notes() == []


async def test_a_temporary_trigger_fences_every_insert_on_the_term_alone(
    pair: tuple[SQLiteBackend, SQLiteBackend, App],
) -> None:
    a, b, app = pair
    app.conn.execute(TRIGGER)
    old = await lead(a, A)
    app.conn.execute("INSERT INTO fenced_log (term, note) VALUES (?, 'a')", (old,))
    new = await hand_over(a, b, old)
    with pytest.raises(sqlite3.IntegrityError, match="leaderd fence"):
        app.conn.execute("INSERT INTO fenced_log (term, note) VALUES (?, 'x')", (old,))
    app.conn.execute("INSERT INTO fenced_log (term, note) VALUES (?, 'b')", (new,))
    assert app.notes() == ["a", "b"]


# docs/fencing.md: a guard on every insert, without the clock (a trigger cannot read
# CLOCK_BOOTTIME): a release or a newer term refuses the write, a lapse alone does not.
TRIGGER = """
CREATE TEMP TRIGGER fenced_log_fence BEFORE INSERT ON main.fenced_log
WHEN NOT EXISTS (SELECT 1 FROM lease.leaderd_lease
                 WHERE election = 'default' AND holder IS NOT NULL AND term = NEW.term)
BEGIN SELECT RAISE(ABORT, 'leaderd fence: stale term'); END"""
