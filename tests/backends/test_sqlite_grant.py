"""sqlite:// one-write hand-over (docs/algorithm.md, "One-write hand-over"): the release
grants the lease to the freshest live campaigning member of another node id, in its own
transaction, and the member's waiting read finds it with the heartbeat it counts from."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from leaderd.backends import Candidate
from leaderd.backends.sqlite.backend import SQLiteBackend
from tests.backend_calls import ask, release
from tests.grants import heard, not_granted_back, wait_grant

E = "default"
A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
C = Candidate("node-c", "10.0.0.3:80")
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


async def test_a_release_grants_the_freshest_standby_the_next_term(opened: Opener) -> None:
    a, b, c = await opened(), await opened(), await opened()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await ask(c, E, C, ttl=TTL, timeout=5)
    b_heard = heard(await ask(b, E, B, ttl=TTL, timeout=5), B)  # the freshest
    waiting = asyncio.ensure_future(wait_grant(b, E))
    await asyncio.sleep(0.1)
    await release(a, E, A, held.term, grant=True)
    grant = await waiting
    assert grant.heard_at == b_heard and grant.lease.held_by(B)
    assert grant.lease.term == held.term + 1 and grant.lease.expires_in == TTL
    seen = await c.observe(E)
    assert seen.holder == B.node_id and seen.term == held.term + 1
    assert seen.expires_in is not None and TTL - 1.0 < seen.expires_in <= TTL
    assert seen.version == grant.lease.version  # what watchers time a takeover by
    # C, campaigning, cannot take it; B's own renewal keeps the granted term.
    assert not (await ask(c, E, C, ttl=TTL, timeout=5)).held_by(C)
    renewed = await ask(b, E, B, ttl=TTL, timeout=5)
    assert renewed.held_by(B) and renewed.term == grant.lease.term
    records = await c.history(E, 10)
    assert [(r.term, r.holder, r.end_reason) for r in records][:2] == [
        (held.term + 1, B.node_id, None),
        (held.term, A.node_id, "released"),
    ]


async def test_the_granted_lease_expires_its_ttl_after_the_heirs_heartbeat(
    opened: Opener,
) -> None:
    a, b, c = await opened(), await opened(), await opened()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await ask(b, E, B, ttl=TTL, timeout=5)
    await asyncio.sleep(1.0)  # B's heartbeat ages; the grant must not restart its ttl
    await release(a, E, A, held.term, grant=True)
    seen = await c.observe(E)
    assert seen.holder == B.node_id
    assert seen.expires_in is not None and seen.expires_in <= TTL - 1.0


async def test_no_grant_to_a_member_cooling_down_stale_or_of_the_same_node_id(
    opened: Opener,
) -> None:
    twin = Candidate(A.node_id, A.address)  # the same node id, another process
    a, b, c, d = await opened(), await opened(), await opened(), await opened()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await ask(c, E, C, ttl=1.0, timeout=5)  # stale after half its ttl
    await asyncio.sleep(0.6)
    await ask(b, E, B, ttl=TTL, timeout=5)
    await b.observe(E, B, TTL)  # then cooling down: heard, not campaigning
    await ask(d, E, twin, ttl=TTL, timeout=5)
    await release(a, E, A, held.term, grant=True)
    released = await b.observe(E)
    assert released.holder is None and released.term == held.term
    assert await b.wait_for_change(E, 0.2) is None


async def test_a_release_without_grant_or_with_a_reservation_grants_nothing(
    opened: Opener,
) -> None:
    a, b = await opened(), await opened()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await ask(b, E, B, ttl=TTL, timeout=5)
    await release(a, E, A, held.term)
    assert (await b.observe(E)).holder is None
    again = await ask(a, E, A, ttl=TTL, timeout=5)
    await ask(b, E, B, ttl=TTL, timeout=5)
    await release(a, E, A, again.term, reserve_for=C.node_id, ttl=TTL, grant=True)
    reserved = await b.observe(E)
    assert reserved.holder is None and reserved.reserved_for == C.node_id


async def test_a_stale_holder_grants_nothing(opened: Opener) -> None:
    """A release names its term: a holder that lost the lease cannot give away its successor's."""
    a, b, c = await opened(), await opened(), await opened()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await ask(b, E, B, ttl=TTL, timeout=5)
    await release(a, E, A, held.term, grant=True)  # B now holds held.term + 1
    await ask(c, E, C, ttl=TTL, timeout=5)
    await release(a, E, A, held.term, grant=True)
    seen = await c.observe(E)
    assert seen.holder == B.node_id and seen.term == held.term + 1


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


async def test_a_leader_that_released_is_not_granted_the_lease_back(opened: Opener) -> None:
    await not_granted_back(await opened(), await opened(), E, TTL)
