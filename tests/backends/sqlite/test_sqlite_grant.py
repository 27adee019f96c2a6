"""sqlite:// one-write hand-over, what is SQLite's own (the rules every backend that grants
keeps are tests/backends/test_grant.py): the heir's waiting read names the grant only by
the member row it was granted from, and an older leaderd's members table is upgraded."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from leaderd.backends import Candidate
from leaderd.backends.sqlite.backend import SQLiteBackend
from tests.support.backend_calls import ask, release

E = "default"
A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
TTL = 4.0

Opener = Callable[[], Awaitable[SQLiteBackend]]


@pytest.fixture
async def opened(tmp_path: Path) -> AsyncIterator[Opener]:
    """Backends on one file in tmp_path, each a daemon of its own; closed after the test."""
    backends: list[SQLiteBackend] = []

    async def open_backend() -> SQLiteBackend:
        backend = SQLiteBackend.from_url(f"sqlite://{tmp_path}/lease.db")
        await backend.open([E])
        backends.append(backend)
        return backend

    yield open_backend
    for backend in backends:
        await backend.close()


async def test_a_heir_heard_again_since_is_told_by_a_round_not_the_grant(
    opened: Opener,
) -> None:
    """The grant counts from one heartbeat; once the member row moved on, the waiting read
    cannot name it, and the engine asks with a round (which finds the lease its own)."""
    a, b, b_again = await opened(), await opened(), await opened()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await ask(b, E, B, ttl=TTL, timeout=5)
    await b.wait_for_change(E, 0.01)  # B's waiter has seen A hold it
    await release(a, E, A, held.term, grant=True)
    await asyncio.sleep(0.01)  # a later stamp (milliseconds)
    await b_again.observe(E, B, TTL)  # B heard again (the member row) before its waiter read
    assert await b.wait_for_change(E, 0.5) is None
    assert (await ask(b, E, B, ttl=TTL, timeout=5)).term == held.term + 1


async def test_a_heir_whose_read_straddled_the_release_leads_on_the_grant(
    opened: Opener,
) -> None:
    """A release commits, then frees its holder lock. A waiter whose read came just before
    that commit, and whose look at the lock just after the unlock, sees a freed lock beside
    a row that still names the holder: no death, and a read after the lock tells (a
    clean-clone run saw the heir lead only after a round of its own). The read is held
    back here until the release has committed and the lock is the waiter's."""
    a, b = await opened(), await opened()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await ask(b, E, B, ttl=TTL, timeout=5)
    await b.wait_for_change(E, 0.01)  # B's lock thread now waits on A's holder lock
    read, released = asyncio.Event(), asyncio.Event()
    real_read = b._look_for_grant

    async def read_before_the_release(election: str, deadline: float) -> Any:
        answer = await real_read(election, deadline)
        if not read.is_set():
            read.set()
            await released.wait()
        return answer

    b._look_for_grant = read_before_the_release  # type: ignore[method-assign]
    waiting = asyncio.create_task(b.wait_for_change(E, TTL))
    await asyncio.wait_for(read.wait(), TTL)
    await release(a, E, A, held.term, grant=True)
    watch = b._proof._watches[E]
    for _ in range(500):  # until B's lock thread holds the lock A freed
        if watch.freed:
            break
        await asyncio.sleep(0.01)
    assert watch.freed
    released.set()
    grant = await asyncio.wait_for(waiting, TTL)
    assert grant is not None and grant.lease.held_by(B), "the heir was sent to a round"
    assert grant.lease.term == held.term + 1


async def test_members_of_an_older_leaderd_gain_the_campaigning_column(
    tmp_path: Path, opened: Opener
) -> None:
    with sqlite3.connect(tmp_path / "lease.db") as db:
        db.execute(
            "CREATE TABLE leaderd_lease_members (election TEXT NOT NULL, node_id TEXT NOT NULL, "
            "instance TEXT NOT NULL, address TEXT NOT NULL DEFAULT '', version TEXT NOT NULL "
            "DEFAULT '', ttl REAL NOT NULL, heard_at TEXT NOT NULL, boot_id TEXT NOT NULL, "
            "heard_boottime REAL NOT NULL, PRIMARY KEY (election, node_id, instance))"
        )
    a = await opened()
    assert (await ask(a, E, A, ttl=TTL, timeout=5)).held_by(A)
    with sqlite3.connect(tmp_path / "lease.db") as db:
        rows = db.execute("SELECT node_id, campaigning FROM leaderd_lease_members").fetchall()
    assert rows == [(A.node_id, 1)]
