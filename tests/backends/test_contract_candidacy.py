"""Who may lead, as every backend records it (docs/algorithm.md, "Who leads"): each
heartbeat carries the member's priority, its health and whether it campaigns, an older
members table gains those columns on open, and a release's grant goes to the standby of the
highest priority, the freshest of those, never to a witness. Run unchanged against every
backend (the grants against every backend that grants)."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

from leaderd.backends import Backend, Candidate
from leaderd.backends.base import Capability
from leaderd.backends.sqlite.backend import SQLiteBackend
from tests.support.backend_calls import ask, release

from .conftest import LONG_TTL, Store
from .test_contract import E, acquire, held
from .test_contract_records import listed

A = Candidate("who-a", "10.0.0.1:1", priority=3)
B = Candidate("who-b", "10.0.0.2:1", priority=0)
SICK = "exec:/usr/bin/app-ok: database unreachable"
ASKED = "who-a 1795000000.000 1795000060.000"  # a switchover request (switchover_request.py)
C = Candidate("who-c", "10.0.0.3:1", health=SICK, switchover=ASKED)


async def test_each_heartbeat_records_priority_health_and_campaigning(store: Store) -> None:
    a, b, c = await store.new(), await store.new(), await store.new()
    await held(a, A)
    await b.observe(E, B, LONG_TTL)  # a witness only reads
    await c.observe(E, C, LONG_TTL)  # so does an unhealthy node
    members = listed(await acquire(a, A))
    seen = {n: (m.priority, m.health, m.campaigning) for (n, _), m in members.items()}
    assert seen == {"who-a": (3, "", True), "who-b": (0, "", False), "who-c": (1, SICK, False)}
    assert {n: m.switchover for (n, _), m in members.items()} == {
        "who-a": "", "who-b": "", "who-c": ASKED,
    }  # fmt: skip
    # Health comes back: the next heartbeat says so.
    healed = replace(C, health="", switchover="")
    await acquire(c, healed)
    again = listed(await acquire(a, A))["who-c", C.instance]
    assert (again.health, again.switchover) == ("", "")


_OLD_SQLITE_MEMBERS = """
CREATE TABLE leaderd_lease_members (election TEXT NOT NULL, node_id TEXT NOT NULL,
    instance TEXT NOT NULL, address TEXT NOT NULL DEFAULT '', version TEXT NOT NULL DEFAULT '',
    ttl REAL NOT NULL, heard_at TEXT NOT NULL, boot_id TEXT NOT NULL,
    heard_boottime REAL NOT NULL, PRIMARY KEY (election, node_id, instance))"""


async def test_an_older_sqlite_members_table_gains_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(_OLD_SQLITE_MEMBERS)
    backend = SQLiteBackend.from_url(f"sqlite://{path}")
    await backend.open([E])
    try:
        lease = await ask(backend, E, A, LONG_TTL)
        assert lease.held_by(A) and listed(lease)["who-a", A.instance].priority == 3
    finally:
        await backend.close()
    with sqlite3.connect(path) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(leaderd_lease_members)")}
    assert {"campaigning", "priority", "health", "switchover"} <= columns


HIGH = Candidate("who-high", "10.0.0.4:1", priority=3)
FRESH = Candidate("who-fresh", "10.0.0.5:1")
WITNESS = Candidate("who-witness", "10.0.0.6:1", priority=0)


async def stand(backend: Backend, who: Candidate) -> None:
    """Two standby rounds (etcd: the first keeps a spare lease, the second offers it)."""
    for _ in range(2):
        assert not (await acquire(backend, who)).held_by(who)


async def test_a_grant_goes_to_the_highest_priority_before_the_freshest(store: Store) -> None:
    store.require(Capability.GRANTS)
    a, high, fresh = await store.new(), await store.new(), await store.new()
    lease = await held(a, A)
    await stand(high, HIGH)
    await stand(fresh, FRESH)  # heard last: the freshest, of a lower priority
    lease = await held(a, A)  # etcd: the leader's renewal reads the offers
    await release(a, E, A, lease.term, grant=True, ttl=LONG_TTL, version=lease.version)
    seen = await fresh.observe(E)
    assert (seen.holder, seen.instance, seen.term) == (HIGH.node_id, HIGH.instance, lease.term + 1)


async def test_a_witness_is_never_granted_the_lease(store: Store) -> None:
    store.require(Capability.GRANTS)
    a, witness = await store.new(), await store.new()
    lease = await held(a, A)
    await stand(witness, WITNESS)  # even one that asks for it
    lease = await held(a, A)  # etcd: the leader's renewal reads the offers
    await release(a, E, A, lease.term, grant=True, ttl=LONG_TTL, version=lease.version)
    seen = await witness.observe(E)
    assert (seen.holder, seen.term) == (None, lease.term)
