"""`run --once-per` job records in the SQLite lease file (backends/jobs.py, docs/run.md).

One table beside the lease table, ``<table>_jobs``, created if missing (the lease table and
``user_version`` are untouched). A start is recorded inside ``BEGIN IMMEDIATE`` only while
the lease row names this process with the term, unexpired on this boot's CLOCK_BOOTTIME (the
check of docs/fencing.md), and only on the record's count of starts as the runner read it.
Times are this host's wall clock, which outlives reboots (a job's period may be days).
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import aiosqlite

from ...clock import boottime, wall_time
from ..base import Candidate
from ..jobs import JobRecord, JobStore, RunStatus
from .boundary import translate, whole
from .host import boot_id, persist_wal
from .url import parse_url

CREATE = """
CREATE TABLE IF NOT EXISTS {j} (
    election         TEXT PRIMARY KEY,
    runs             INTEGER NOT NULL,            -- recorded starts, ever
    started_at       REAL,                        -- wall clock (Unix seconds) of the last start
    started_by       TEXT NOT NULL DEFAULT '',    -- its node id
    term             INTEGER NOT NULL DEFAULT 0,  -- the term it started under
    ended_at         REAL,
    status           TEXT,                        -- running, succeeded, failed, stopped, ...
    exit_code        INTEGER,
    succeeded_at     REAL,                        -- the end of the last successful run
    first_started_at REAL
)"""
_COLUMNS = (
    "runs, started_at, started_by, term, ended_at, status, exit_code, succeeded_at, "
    "first_started_at"
)
_HELD = """
SELECT 1 FROM {t} WHERE election = :election AND holder = :holder AND instance = :instance
    AND term = :term AND boot_id = :boot_id AND expires_boottime > :now"""
_START = """
INSERT INTO {j} (election, runs, started_at, started_by, term, status, first_started_at)
VALUES (:election, 1, :wall, :holder, :term, 'running', :wall)
ON CONFLICT (election) DO UPDATE SET runs = runs + 1, started_at = :wall,
    started_by = :holder, term = :term, ended_at = NULL, status = 'running', exit_code = NULL
WHERE runs = :runs"""
_FINISH = """
UPDATE {j} SET ended_at = :wall, status = :status, exit_code = :exit_code,
    succeeded_at = CASE WHEN :status = 'succeeded' THEN :wall ELSE succeeded_at END
WHERE election = :election AND runs = :run AND status = 'running'"""
_INTERRUPT = """
UPDATE {j} SET ended_at = :wall, status = 'interrupted'
WHERE election = :election AND runs = :run AND status = 'running' AND term < :term"""


class SQLiteJobStore(JobStore):
    def __init__(self, path: str, table: str, busy_timeout_ms: int) -> None:
        self.path, self.table = path, table
        self._names = {"t": table, "j": f"{table}_jobs"}
        self._busy_ms = busy_timeout_ms
        self._conn: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()
        self._boot_id = ""

    @classmethod
    def from_url(cls, url: str) -> SQLiteJobStore:
        path, table, busy, _poll, _crash = parse_url(url)
        return cls(path, table, busy)

    async def open(self) -> None:
        self._boot_id = boot_id()
        await self._run(self._create)

    async def read(self, election: str) -> JobRecord:
        record: JobRecord = await self._run(self._read, election)
        return record

    async def start(self, election: str, candidate: Candidate, term: int, runs: int) -> JobRecord:
        args = {"election": election, "holder": candidate.node_id, "instance": candidate.instance,
                "term": term, "runs": runs, "boot_id": self._boot_id}  # fmt: skip
        record: JobRecord = await self._run(self._start, args)
        return record

    async def finish(
        self, election: str, run: int, status: RunStatus, exit_code: int | None
    ) -> None:
        args = {"election": election, "run": run, "status": status.value, "exit_code": exit_code}
        await self._run(self._write, _FINISH, args)

    async def interrupt(self, election: str, run: int, below_term: int) -> None:
        await self._run(
            self._write, _INTERRUPT, {"election": election, "run": run, "term": below_term}
        )

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _run(self, fn: Any, *args: Any) -> Any:
        """One request, whole in the connection's thread; errors translated here."""
        async with self._lock:
            try:
                conn = await self._connection()
                call = conn._execute(whole, conn._conn, self._busy_ms, fn, *args)  # type: ignore[no-untyped-call]
                return await call
            except (sqlite3.Error, OSError) as exc:
                raise translate(exc, self.path) from None

    async def _connection(self) -> aiosqlite.Connection:
        if self._conn is None:
            conn = await aiosqlite.connect(self.path, isolation_level=None)
            await conn.execute("PRAGMA synchronous = FULL")  # a recorded start survives power loss
            await conn._execute(persist_wal, conn._conn, self.path)  # type: ignore[no-untyped-call]
            self._conn = conn
        return self._conn

    def _create(self, db: sqlite3.Connection) -> None:
        db.execute(CREATE.format(**self._names))

    def _read(self, db: sqlite3.Connection, election: str) -> JobRecord:
        sql = f"SELECT {_COLUMNS} FROM {self._names['j']} WHERE election = ?"
        return _record(election, db.execute(sql, (election,)).fetchone(), wall_time())

    def _start(self, db: sqlite3.Connection, args: dict[str, Any]) -> JobRecord:
        db.execute("BEGIN IMMEDIATE")
        args = {**args, "wall": wall_time(), "now": boottime()}  # read under the write lock
        if db.execute(_HELD.format(**self._names), args).fetchone():
            db.execute(_START.format(**self._names), args)
        db.execute("COMMIT")
        return self._read(db, args["election"])

    def _write(self, db: sqlite3.Connection, sql: str, args: dict[str, Any]) -> None:
        db.execute(sql.format(**self._names), {**args, "wall": wall_time()})


def _record(election: str, row: Any, now: float) -> JobRecord:
    if row is None:
        return JobRecord(election, now)
    runs, started_at, started_by, term, ended_at, status, exit_code, succeeded_at, first = row
    return JobRecord(election, now, runs, started_at, started_by, term, ended_at,
                     RunStatus(status) if status else None, exit_code, succeeded_at,
                     first)  # fmt: skip
