"""The SQLite lease table: its statements, its creation and its migrations (docs/sqlite.md)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import suppress

import aiosqlite

from ..clock import boottime, suspended_for, wall_time
from . import sqlite_records

SCHEMA_VERSION = 3

CREATE = """
CREATE TABLE IF NOT EXISTS {table} (
    election         TEXT PRIMARY KEY,
    holder           TEXT,
    instance         TEXT NOT NULL DEFAULT '',
    address          TEXT NOT NULL DEFAULT '',
    term             INTEGER NOT NULL DEFAULT 0,
    acquired_at      TEXT,
    renewed_at       TEXT,
    expires_at       TEXT,
    boot_id          TEXT NOT NULL DEFAULT '',
    expires_boottime REAL NOT NULL DEFAULT 0,
    version          INTEGER NOT NULL DEFAULT 0,
    reserved_for     TEXT,
    reserved_until   REAL NOT NULL DEFAULT 0
)"""
# Columns added since schema 1, with their definitions (schema 2: instance, version;
# schema 3: the reservation of a released lease for one node id).
_ADDED = {
    "instance": "TEXT NOT NULL DEFAULT ''",
    "version": "INTEGER NOT NULL DEFAULT 0",
    "reserved_for": "TEXT",
    "reserved_until": "REAL NOT NULL DEFAULT 0",
}
SELECT = """
SELECT holder, instance, address, term, acquired_at, boot_id, expires_boottime, version,
       reserved_for, reserved_until
FROM {table} WHERE election = ?"""
# live: the stored lease has not lapsed on this boot's CLOCK_BOOTTIME.
LIVE = "(holder IS NOT NULL AND boot_id = :boot_id AND expires_boottime > :now)"
MINE = "(holder = :holder AND instance = :instance)"
# reserved: a released lease still reserved for another node id on this boot's clock.
RESERVED = """(reserved_for IS NOT NULL AND reserved_for <> :holder AND boot_id = :boot_id
    AND reserved_until > :now)"""
CAS = f"""
INSERT INTO {{table}} (election, holder, instance, address, term, acquired_at, renewed_at,
                       expires_at, boot_id, expires_boottime, version)
VALUES (:election, :holder, :instance, :address, MAX(1, :min_term), :wall, :wall, :expires_at,
        :boot_id, :expires, 1)
ON CONFLICT (election) DO UPDATE SET
    term = CASE WHEN {MINE} AND {LIVE} THEN term ELSE MAX(term + 1, :min_term) END,
    acquired_at = CASE WHEN {MINE} AND {LIVE} THEN acquired_at ELSE :wall END,
    holder = :holder, instance = :instance, address = :address, renewed_at = :wall,
    expires_at = :expires_at, boot_id = :boot_id, expires_boottime = :expires,
    version = version + 1, reserved_for = NULL, reserved_until = 0
WHERE (holder IS NULL AND NOT {RESERVED}) OR {MINE}
   OR (holder IS NOT NULL AND NOT {LIVE} AND version = :takeover)"""
# A release (or its grant) applies only to the version last answered ('': any): one that
# runs late, after a renewal of the same term, changes nothing (docs/sqlite.md).
OF_VERSION = "(:version = '' OR CAST(version AS TEXT) = :version)"
# The holder's own row, so its boot id is this host's: the reservation's clock.
RELEASE = f"""
UPDATE {{table}} SET holder = NULL, instance = '', address = '', expires_at = :wall,
    expires_boottime = :now, version = version + 1,
    reserved_for = NULLIF(:reserve_for, ''), reserved_until = :now + :reserve_ttl
WHERE election = :election AND holder = :holder AND instance = :instance AND term = :term
  AND {OF_VERSION}"""
# A new file's terms start at the wall clock in milliseconds, above any term a file it
# replaces could have granted: a deleted lease file never restarts terms at 1.
SEED = "INSERT OR IGNORE INTO {table} (election, term) VALUES (?, ?)"
# A file created while other daemons still run (on a file since deleted): its rows name an
# unknown holder (''), expired, so the first acquisition waits one ttl (docs/sqlite.md).
PLACEHOLDER = """
INSERT OR IGNORE INTO {table} (election, holder, term, boot_id, expires_boottime, version)
VALUES (?, '', ?, ?, ?, 1)"""


async def prepare(
    conn: aiosqlite.Connection,
    table: str,
    elections: Sequence[str],
    alone: bool,
    my_boot_id: str,
) -> None:
    """WAL, durable commits, the table and rows, and a write probe (catches read-only files)."""
    async with conn.execute("PRAGMA journal_mode = WAL") as cursor:
        mode = await cursor.fetchone()
    if mode is None or str(mode[0]).lower() != "wal":
        raise sqlite3.DatabaseError(f"cannot switch to WAL mode (journal_mode is {mode})")
    await conn.execute("PRAGMA synchronous = FULL")  # a granted term must survive power loss
    async with conn.execute("PRAGMA user_version") as cursor:
        version = await cursor.fetchone()
    schema = 0 if version is None else int(version[0])
    if schema > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(f"schema version {schema} is newer than this leaderd")
    await conn.execute("BEGIN IMMEDIATE")
    try:
        new_file = not await _table_exists(conn, table)
        await conn.execute(CREATE.format(table=table))
        await sqlite_records.create(conn, table)  # members and history: their own tables
        if not new_file and schema < SCHEMA_VERSION:
            await _migrate(conn, table)
        if new_file:
            await _seed(conn, table, elections, alone, my_boot_id)
        for election in elections:  # so an operator sees every election, even one never held
            await conn.execute(f"INSERT OR IGNORE INTO {table} (election) VALUES (?)", (election,))
        await conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")  # always writes
        await conn.execute("COMMIT")
    except BaseException:
        with suppress(sqlite3.Error):
            await conn.execute("ROLLBACK")
        raise


async def _seed(
    conn: aiosqlite.Connection, table: str, elections: Sequence[str], alone: bool, boot: str
) -> None:
    floor = int(wall_time() * 1000)
    for election in elections:
        if alone:
            await conn.execute(SEED.format(table=table), (election, floor))
        else:
            await conn.execute(PLACEHOLDER.format(table=table), (election, floor, boot, boottime()))


async def _table_exists(conn: aiosqlite.Connection, table: str) -> bool:
    sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    async with conn.execute(sql, (table,)) as cursor:
        return await cursor.fetchone() is not None


async def _migrate(conn: aiosqlite.Connection, table: str) -> None:
    """Schema 1 -> 2: instance and version columns; expiry moves to CLOCK_BOOTTIME.
    Schema 2 -> 3: the reservation columns (none is reserved: NULL, 0)."""
    async with conn.execute(f"PRAGMA table_info({table})") as cursor:
        columns = {str(row[1]) for row in await cursor.fetchall()}
    for column, definition in _ADDED.items():
        if column not in columns:
            await conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
    if "expires_mono" in columns:
        # A live lease keeps its remaining time: monotonic deadline + (boottime - monotonic).
        await conn.execute(f"ALTER TABLE {table} RENAME COLUMN expires_mono TO expires_boottime")
        offset = suspended_for()
        sql = f"UPDATE {table} SET expires_boottime = expires_boottime + ?"
        await conn.execute(sql, (offset,))
