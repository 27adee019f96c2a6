"""The lease row: its shape, how one is read, and the Lease it says on this host's clock."""

from __future__ import annotations

import datetime as dt
import sqlite3
from typing import Any

from ..base import Candidate, Lease

# A lease row as schema.SELECT reads it (the last column: the holder's proof, proof.py).
Row = tuple[str | None, str, str, int, str | None, str, float, int, str | None, float, str | None]


def holding(lease: Lease) -> tuple[str | None, str, int]:
    return lease.holder, lease.instance, lease.term


def lease_of(election: str, row: Row, now: float, my_boot_id: str) -> Lease:
    holder, instance, address, term, acquired_at, row_boot_id, expires, version = row[:8]
    reserved_for, reserved_until = row[8], row[9]
    if holder is None:
        # A reservation made on another boot cannot be timed on ours: it has lapsed.
        reserved = bool(reserved_for) and row_boot_id == my_boot_id and reserved_until > now
        return Lease(
            election,
            None,
            "",
            term,
            None,
            None,
            version=str(version),
            reserved_for=str(reserved_for) if reserved else "",
            reserved_in=reserved_until - now if reserved else 0.0,
        )
    # Another boot's clock cannot be read on ours: its lease counts as expired, not free.
    live = row_boot_id == my_boot_id and expires > now
    acquired = dt.datetime.fromisoformat(acquired_at) if acquired_at else None
    expires_in = expires - now if live else 0.0
    return Lease(
        election, holder, address, term, acquired, expires_in, instance, version=str(version)
    )


def fetch(db: sqlite3.Connection, sql: str, election: str) -> Row | None:
    row: Any = db.execute(sql, (election,)).fetchone()
    return None if row is None else tuple(row)


def names(row: Row | None, me: Candidate) -> bool:
    """The row names this very process (node id and instance) as its holder."""
    return row is not None and (row[0], row[1]) == (me.node_id, me.instance)


def holder_proof(row: Row | None, my_boot_id: str) -> tuple[str, str | None]:
    """The row's holder instance and proof; no proof from another kernel's boot, whose
    locks this kernel cannot see (docs/algorithm.md, "Crash failover on one host")."""
    if row is None:
        return "", None
    return row[1], row[10] if row[5] == my_boot_id else None
