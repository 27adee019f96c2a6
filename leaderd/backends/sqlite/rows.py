"""The lease row: its shape, how one is read, and the Lease it says on this host's clock."""

from __future__ import annotations

import datetime as dt
import sqlite3
from typing import Any

from ..base import Lease

Row = tuple[str | None, str, str, int, str | None, str, float, int, str | None, float]


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
