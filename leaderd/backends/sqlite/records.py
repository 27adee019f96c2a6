"""The SQLite members and history tables (docs/sqlite.md): statements run inside the lease
backend's own transactions, so they add no request and cannot race the lease they describe.

Both tables sit beside the lease table (``<table>_members``, ``<table>_history``) and are
created if missing: the lease table and its schema version are untouched. Ages are judged on
CLOCK_BOOTTIME with the boot id, as leases are; a member written under another boot is dead.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from typing import Any

import aiosqlite

from ..base import Candidate
from ..records import (
    HISTORY_RETENTION,
    PRUNE_AFTER_TTLS,
    EndReason,
    Member,
    Tenure,
    end_of_acquisition,
)

CREATE_MEMBERS = """
CREATE TABLE IF NOT EXISTS {table}_members (
    election       TEXT NOT NULL,
    node_id        TEXT NOT NULL,
    instance       TEXT NOT NULL,
    address        TEXT NOT NULL DEFAULT '',
    version        TEXT NOT NULL DEFAULT '',
    ttl            REAL NOT NULL,
    heard_at       TEXT NOT NULL,
    boot_id        TEXT NOT NULL,
    heard_boottime REAL NOT NULL,
    campaigning    INTEGER NOT NULL DEFAULT 0,  -- heard asking for the lease: a grant may go to it
    priority       INTEGER NOT NULL DEFAULT 1,  -- a grant prefers the highest, 0 never leads
    health         TEXT NOT NULL DEFAULT '',    -- why its health checks fail, '' while they pass
    switchover     TEXT NOT NULL DEFAULT '',    -- the switchover it asks the leader for
    PRIMARY KEY (election, node_id, instance)
)"""
# Added since the members table first shipped: an older file gains them (default: not
# asking, the default priority, healthy).
_ADDED = {
    "campaigning": "INTEGER NOT NULL DEFAULT 0",
    "priority": "INTEGER NOT NULL DEFAULT 1",
    "health": "TEXT NOT NULL DEFAULT ''",
    "switchover": "TEXT NOT NULL DEFAULT ''",
}
CREATE_HISTORY = """
CREATE TABLE IF NOT EXISTS {table}_history (
    election    TEXT NOT NULL,
    term        INTEGER NOT NULL,
    holder      TEXT NOT NULL,
    instance    TEXT NOT NULL DEFAULT '',
    address     TEXT NOT NULL DEFAULT '',
    acquired_at TEXT NOT NULL,
    ended_at    TEXT,
    end_reason  TEXT,
    PRIMARY KEY (election, term)
)"""
_HEARD = """
INSERT INTO {table}_members (election, node_id, instance, address, version, ttl, heard_at,
                             boot_id, heard_boottime, campaigning, priority, health, switchover)
VALUES (:election, :node_id, :instance, :address, :version, :ttl, :wall, :boot_id, :now,
        :campaigning, :priority, :health, :switchover)
ON CONFLICT (election, node_id, instance) DO UPDATE SET address = :address,
    version = :version, ttl = :ttl, heard_at = :wall, boot_id = :boot_id,
    heard_boottime = :now, campaigning = :campaigning, priority = :priority, health = :health,
    switchover = :switchover"""
_PRUNE = f"""
DELETE FROM {{table}}_members
WHERE election = :election AND (boot_id != :boot_id
    OR heard_boottime + ttl * {PRUNE_AFTER_TTLS} < :now)"""
# A releasing process no longer asks for the lease: no later release may grant it back.
_WITHDRAWN = """
UPDATE {table}_members SET campaigning = 0
WHERE election = :election AND node_id = :holder AND instance = :instance"""
_MEMBERS = """
SELECT node_id, instance, address, version, ttl, heard_at, boot_id, heard_boottime,
    campaigning, priority, health, switchover
FROM {table}_members WHERE election = ? ORDER BY node_id, instance"""
_END = """
UPDATE {table}_history SET ended_at = coalesce(:ended_at, :wall), end_reason = :reason
WHERE election = :election AND ended_at IS NULL AND term < :term"""
_BEGIN = """
INSERT OR REPLACE INTO {table}_history (election, term, holder, instance, address, acquired_at)
VALUES (:election, :term, :holder, :instance, :address, :wall)"""
_RETAIN = f"""
DELETE FROM {{table}}_history WHERE election = :election AND term < (
    SELECT min(term) FROM (SELECT term FROM {{table}}_history WHERE election = :election
                           ORDER BY term DESC LIMIT {HISTORY_RETENTION}))"""
_LOST = f"""
UPDATE {{table}}_history SET end_reason = '{EndReason.LOST_BACKEND}'
WHERE election = :election AND term = :lost_term AND holder = :holder
  AND instance = :instance AND ended_at IS NOT NULL"""
_RELEASED = """
UPDATE {table}_history SET ended_at = :wall, end_reason = :reason
WHERE election = :election AND term = :term AND ended_at IS NULL"""
_HISTORY = """
SELECT election, term, holder, instance, address, acquired_at, ended_at, end_reason
FROM {table}_history WHERE election = ? ORDER BY term DESC LIMIT ?"""


async def create(conn: aiosqlite.Connection, table: str) -> None:
    """Create both tables if missing, and add the members' newer columns to an older file
    (inside the caller's transaction)."""
    await conn.execute(CREATE_MEMBERS.format(table=table))
    await conn.execute(CREATE_HISTORY.format(table=table))
    async with conn.execute(f"PRAGMA table_info({table}_members)") as cursor:
        columns = {str(row[1]) for row in await cursor.fetchall()}
    for column, kind in _ADDED.items():
        if column not in columns:
            await conn.execute(f"ALTER TABLE {table}_members ADD COLUMN {column} {kind}")


def heard(
    db: sqlite3.Connection,
    table: str,
    election: str,
    me: Candidate,
    clock: dict[str, Any],
    campaigning: bool,
) -> None:
    """Register ``me`` and prune the long-silent; ``clock``: wall, boot_id, now, ttl.
    ``campaigning``: ``me`` asks for the lease now (not cooling down, not stopping)."""
    params = {"election": election, "node_id": me.node_id, "instance": me.instance,
              "address": me.address, "version": me.leaderd_version,
              "campaigning": int(campaigning), "priority": me.priority, "health": me.health,
              "switchover": me.switchover,
              **clock}  # fmt: skip
    db.execute(_HEARD.format(table=table), params)
    db.execute(_PRUNE.format(table=table), params)


def members(
    db: sqlite3.Connection, table: str, election: str, boot_id: str, now: float
) -> tuple[Member, ...]:
    rows = db.execute(_MEMBERS.format(table=table), (election,)).fetchall()
    found = []
    for node_id, instance, address, version, ttl, heard_at, boot, heard_boottime, *who in rows:
        # Another boot's clock cannot be read on ours: that process is gone.
        ago = now - heard_boottime if boot == boot_id else float(ttl) * PRUNE_AFTER_TTLS
        campaigning, priority, health, switchover = bool(who[0]), int(who[1]), *map(str, who[2:])
        found.append(Member(node_id, instance, address, version, float(ttl), when(heard_at), ago,
                            campaigning, priority, health, switchover))  # fmt: skip
    return tuple(found)


def began(
    db: sqlite3.Connection,
    table: str,
    election: str,
    me: Candidate,
    rows: tuple[Any, Any],
    clock: tuple[float, float, str],
    died: bool = False,
) -> None:
    """When the CAS began a term for ``me`` (the lease ``rows`` before and after it), end
    the previous record(s), begin this one and keep the newest few. ``clock``: the wall
    clock, CLOCK_BOOTTIME and boot id of the transaction; ``died``: the previous holder's
    death was proven (its holder lock freed), so its term ended now."""
    (before, after), (wall, now, boot_id) = rows, clock
    if after is None or (after[0], after[1]) != (me.node_id, me.instance):
        return
    if before is not None and before[3] == after[3]:
        return  # a renewal
    free = before is None or before[0] is None
    mine = before is not None and (before[0], before[1]) == (me.node_id, me.instance)
    ended_at = None
    if before is not None and not free and before[5] == boot_id:
        ended_at = iso(wall - max(0.0, now - before[6]))  # when it lapsed, not now
    reason = EndReason.HOLDER_DIED if died else end_of_acquisition(mine, free, lost=False)
    values = {"election": election, "term": after[3], "wall": iso(wall), "ended_at": ended_at,
              "reason": reason.value, "holder": me.node_id, "instance": me.instance,
              "address": me.address}  # fmt: skip
    db.execute(_END.format(table=table), values)
    db.execute(_BEGIN.format(table=table), values)
    db.execute(_RETAIN.format(table=table), values)


def lost(db: sqlite3.Connection, table: str, election: str, me: Candidate, lost_term: int) -> None:
    """This process stepped down from ``lost_term`` unable to reach the file: say so."""
    params = {"election": election, "lost_term": lost_term, "holder": me.node_id,
              "instance": me.instance}  # fmt: skip
    db.execute(_LOST.format(table=table), params)


def released(db: sqlite3.Connection, table: str, params: dict[str, Any], reason: str) -> None:
    """End the released term's record with ``reason`` (records.end_text); ``params``:
    election, term, wall."""
    db.execute(_RELEASED.format(table=table), {**params, "reason": reason})


def granted(
    db: sqlite3.Connection, table: str, params: dict[str, Any], to: Candidate, term: int
) -> None:
    """A release granted ``term`` to ``to``: begin its record (the released one is ended by
    ``released``) and keep the newest few; ``params``: election, wall."""
    values = {"election": params["election"], "term": term, "wall": params["wall"],
              "holder": to.node_id, "instance": to.instance, "address": to.address}  # fmt: skip
    db.execute(_BEGIN.format(table=table), values)
    db.execute(_RETAIN.format(table=table), values)


def withdrawn(db: sqlite3.Connection, table: str, params: dict[str, Any]) -> None:
    """The releasing process (``params``: election, holder, instance) stops campaigning."""
    db.execute(_WITHDRAWN.format(table=table), params)


def history(db: sqlite3.Connection, table: str, election: str, limit: int) -> list[Tenure]:
    rows = db.execute(_HISTORY.format(table=table), (election, limit)).fetchall()
    return [
        Tenure(e, int(term), holder, instance, address, when(began), when(ended), reason)
        for e, term, holder, instance, address, began, ended, reason in rows
    ]


def iso(t: float) -> str:
    """A wall-clock instant as stored: RFC 3339, UTC, milliseconds, Z."""
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def when(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
