"""sqlite:// one-write hand-over (docs/algorithm.md, "One-write hand-over"; docs/sqlite.md).

A graceful release hands the lease, in its own transaction, to the member the engine's
``Heir`` allows of the highest priority, the freshest of those (docs/algorithm.md, "Who
leads"): term + 1, expiring its ttl after that
member's heartbeat on this host's CLOCK_BOOTTIME. The lease row keeps the heartbeat's wall
stamp in ``renewed_at``. The commit wakes every waiter; the heir's read finds the lease
held by its own instance, and its member row names the heartbeat the expiry counts from.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from dataclasses import dataclass
from typing import Any

from ..asks import Heir
from ..base import Candidate
from . import records
from .schema import OF_VERSION

_HEIR = """
SELECT node_id, instance, address, ttl, heard_at, heard_boottime FROM {table}_members
WHERE election = :election AND node_id <> :releaser AND campaigning = 1
  AND priority >= :min_priority AND (health = '' OR NOT :healthy)
  AND boot_id = :boot_id AND heard_boottime > :now - ttl * :heard_within_ttls
ORDER BY priority DESC, heard_boottime DESC, node_id, instance LIMIT 1"""
_GRANT = f"""
UPDATE {{table}} SET holder = :node_id, instance = :heir, address = :address,
    term = term + 1, acquired_at = :wall, renewed_at = :heard_at, expires_at = :expires_at,
    boot_id = :boot_id, expires_boottime = :expires, version = version + 1,
    reserved_for = NULL, reserved_until = 0, proof = NULL
WHERE election = :election AND holder = :holder AND instance = :instance AND term = :term
  AND {OF_VERSION}"""
# The heir's heartbeat that the lease row names: its expiry counts from it.
_HEARTBEAT = """
SELECT m.heard_at, m.ttl, m.heard_boottime, l.expires_boottime FROM {table}_members m
JOIN {table} l ON l.election = m.election AND l.holder = m.node_id AND l.instance = m.instance
WHERE m.election = :election AND m.node_id = :node_id AND m.instance = :instance
  AND m.boot_id = l.boot_id AND m.heard_at = l.renewed_at"""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The heir's heartbeat a grant counts from: its wall stamp (records.Member.heard_at,
    as that request's answer listed it) and the seconds the lease lasts after it."""

    heard_at: dt.datetime
    lasts: float


def grant(db: sqlite3.Connection, table: str, params: dict[str, Any], heir: Heir) -> bool:
    """Inside the release's transaction: hand the releaser's lease (``params``: election,
    holder, instance, term, wall, now, boot_id) to the freshest member ``heir`` allows.
    False when there is none or the releaser does not hold that term."""
    chosen = {**params, **heir.params()}
    found = db.execute(_HEIR.format(table=table), chosen).fetchone()
    if found is None:
        return False
    node_id, instance, address, ttl, heard_at, heard_boottime = found
    expires = float(heard_boottime) + float(ttl)
    wall = params["wall_seconds"] + (expires - params["now"])
    values = {**params, "node_id": node_id, "heir": instance, "address": address,
              "heard_at": heard_at, "expires": expires,
              "expires_at": records.iso(wall)}  # fmt: skip
    if db.execute(_GRANT.format(table=table), values).rowcount == 0:
        return False
    records.granted(db, table, values, Candidate(node_id, address, instance), params["term"] + 1)
    return True


def heartbeat(db: sqlite3.Connection, table: str, election: str, me: Candidate) -> Heartbeat | None:
    """The heartbeat of ``me`` that the lease ``me`` holds counts from; None when the lease
    row names none of ``me``'s (not ``me``'s, or ``me`` was heard again since)."""
    values = {"election": election, "node_id": me.node_id, "instance": me.instance}
    found = db.execute(_HEARTBEAT.format(table=table), values).fetchone()
    if found is None:
        return None
    heard_at, ttl, heard_boottime, expires = found
    stamp = records.when(heard_at)
    if stamp is None:
        return None
    return Heartbeat(stamp, min(float(ttl), float(expires) - float(heard_boottime)))
