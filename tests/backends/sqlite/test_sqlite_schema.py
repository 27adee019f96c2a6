"""The SQLite lease table's schema versions: an older file is upgraded in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from leaderd.backends import Candidate
from leaderd.backends.sqlite.backend import SQLiteBackend
from leaderd.backends.sqlite.host import boot_id
from leaderd.backends.sqlite.schema import SCHEMA_VERSION
from leaderd.clock import boottime
from tests.support.backend_calls import ask, release

from ..conftest import ELECTIONS, LONG_TTL

E = "default"
A, B, C = Candidate("node-a"), Candidate("node-b"), Candidate("node-c")

# The table as leaderd wrote it at schema 2 (before reservations), with a released lease.
SCHEMA_2 = """
CREATE TABLE leaderd_lease (
    election TEXT PRIMARY KEY, holder TEXT, instance TEXT NOT NULL DEFAULT '',
    address TEXT NOT NULL DEFAULT '', term INTEGER NOT NULL DEFAULT 0, acquired_at TEXT,
    renewed_at TEXT, expires_at TEXT, boot_id TEXT NOT NULL DEFAULT '',
    expires_boottime REAL NOT NULL DEFAULT 0, version INTEGER NOT NULL DEFAULT 0);
INSERT INTO leaderd_lease (election, holder, term, version) VALUES ('default', NULL, 7, 3);
PRAGMA user_version = 2;
"""


async def test_a_schema_2_file_gains_the_reservation_columns_and_keeps_its_terms(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA_2)
    backends = [SQLiteBackend.from_url(f"sqlite://{path}") for _ in range(3)]
    try:
        for backend in backends:
            await backend.open(ELECTIONS)
        a, b, c = backends
        mine = await ask(a, E, A, LONG_TTL, timeout=10)
        assert mine.held_by(A) and mine.term == 8  # the old file's term, plus one
        await release(a, E, A, mine.term, reserve_for=C.node_id, ttl=LONG_TTL)
        assert not (await ask(b, E, B, LONG_TTL, timeout=10)).held_by(B)
        assert (await ask(c, E, C, LONG_TTL, timeout=10)).term == 9
    finally:
        for backend in backends:
            await backend.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        columns = [row[1] for row in conn.execute("PRAGMA table_info(leaderd_lease)")]
        assert columns[-3:] == ["reserved_for", "reserved_until", "proof"]
        row = conn.execute(
            "SELECT holder, reserved_for FROM leaderd_lease WHERE election = ?", (E,)
        )
        assert row.fetchone() == ("node-c", None)  # the acquisition ended the reservation


async def test_a_lease_live_while_upgrading_to_schema_4_is_waited_out(tmp_path: Path) -> None:
    """Its holder recorded no proof: the one-ttl rule only, whoever holds the lock file."""
    path = tmp_path / "old.db"
    boot = boot_id()
    live_until = boottime() + LONG_TTL
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA_2.replace("PRAGMA user_version = 2;", ""))
        conn.execute("ALTER TABLE leaderd_lease ADD COLUMN reserved_for TEXT")
        conn.execute("ALTER TABLE leaderd_lease ADD COLUMN reserved_until REAL NOT NULL DEFAULT 0")
        conn.execute(
            "UPDATE leaderd_lease SET holder = 'node-a', instance = 'gone', boot_id = ?, "
            "expires_boottime = ?",
            (boot, live_until),
        )
        conn.execute("PRAGMA user_version = 3")
    b = SQLiteBackend.from_url(f"sqlite://{path}")
    try:
        await b.open(ELECTIONS)
        assert not (await ask(b, E, B, LONG_TTL, timeout=10)).held_by(B)
    finally:
        await b.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 4
        row = conn.execute("SELECT holder, proof FROM leaderd_lease").fetchone()
        assert row == ("node-a", None)
