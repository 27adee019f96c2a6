"""`run --once-per` job records beside the PostgreSQL lease table (backends/jobs.py,
docs/run.md): ``<table>_jobs`` in the lease table's schema, created if missing.

A start is one statement: the lease row, read ``FOR SHARE`` and required to name this
process with the term, unexpired on the server's clock (the check of docs/fencing.md),
and the record's upsert conditioned on its count of starts as the runner read it. Times are
the server's clock, as Unix seconds. The session commits durably (conn.connect).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Self

from ..base import Candidate
from ..jobs import JobRecord, JobStore, RunStatus
from .conn import close_quietly, connect, create_if_missing, request
from .settings import PgSettings

_TIMEOUT = 5.0

CREATE = """
CREATE TABLE IF NOT EXISTS {j} (
    election         text PRIMARY KEY,
    runs             bigint NOT NULL,             -- recorded starts, ever
    started_at       timestamptz,                 -- the last start (server clock)
    started_by       text NOT NULL DEFAULT '',    -- its node id
    term             bigint NOT NULL DEFAULT 0,   -- the term it started under
    ended_at         timestamptz,
    status           text,                        -- running, succeeded, failed, stopped, ...
    exit_code        integer,
    succeeded_at     timestamptz,                 -- the end of the last successful run
    first_started_at timestamptz
)"""
_EPOCH = "extract(epoch FROM {c})::float8 AS {c}"
_READ = f"""
SELECT extract(epoch FROM now())::float8 AS now, j.runs, {_EPOCH.format(c="started_at")},
       j.started_by, j.term, {_EPOCH.format(c="ended_at")}, j.status, j.exit_code,
       {_EPOCH.format(c="succeeded_at")}, {_EPOCH.format(c="first_started_at")}
FROM (SELECT 1) AS one LEFT JOIN {{j}} AS j ON j.election = $1"""
# $1 election, $2 node id, $3 instance, $4 term: the lease row names the candidate with the
# term, unexpired; read FOR SHARE, so no takeover's write passes it before this commits.
HELD = """
    SELECT 1 FROM {t} WHERE election = $1 AND holder = $2 AND instance = $3 AND term = $4
        AND expires_at > clock_timestamp() FOR SHARE"""
# The same, and $5 the starts the runner read.
_START = """
WITH held AS ({held}
)
INSERT INTO {j} AS j (election, runs, started_at, started_by, term, status, first_started_at)
SELECT $1, 1, now(), $2, $4, 'running', now() FROM held
ON CONFLICT (election) DO UPDATE SET runs = j.runs + 1, started_at = now(), started_by = $2,
    term = $4, ended_at = NULL, status = 'running', exit_code = NULL
WHERE j.runs = $5"""
# $1 election, $2 run, $3 status, $4 exit code.
_FINISH = """
UPDATE {j} SET ended_at = now(), status = $3, exit_code = $4,
    succeeded_at = CASE WHEN $3 = 'succeeded' THEN now() ELSE succeeded_at END
WHERE election = $1 AND runs = $2 AND status = 'running'"""
# $1 election, $2 run, $3 the reader's term.
_INTERRUPT = """
UPDATE {j} SET ended_at = now(), status = 'interrupted'
WHERE election = $1 AND runs = $2 AND status = 'running' AND term < $3"""


class PostgresJobStore(JobStore):
    HELD = HELD  # the start's condition: the candidate holds the lease with the term
    DEFAULT_TABLE = "leaderd_lease"

    def __init__(self, settings: PgSettings) -> None:
        self._pg = settings
        self._table = f'"{settings.schema}"."{settings.table}_jobs"'
        names = {"t": settings.qualified_table, "j": self._table}
        start = _START.replace("{held}", self.HELD)
        self._sql = {k: v.format(**names) for k, v in
                     {"create": CREATE, "read": _READ, "start": start, "finish": _FINISH,
                      "interrupt": _INTERRUPT}.items()}  # fmt: skip
        self._conn: Any = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str) -> Self:
        return cls(PgSettings.from_url(url, default_table=cls.DEFAULT_TABLE))

    async def open(self) -> None:
        async with self._session("creating the jobs table") as conn:
            await create_if_missing(conn, self._sql["create"], self._table)

    async def read(self, election: str) -> JobRecord:
        row = await self._fetchrow("reading the job record", "read", election)
        return _record(election, row)

    async def start(self, election: str, candidate: Candidate, term: int, runs: int) -> JobRecord:
        args = (election, candidate.node_id, candidate.instance, term, runs)
        await self._execute("recording the job's start", "start", *args)
        return await self.read(election)

    async def finish(
        self, election: str, run: int, status: RunStatus, exit_code: int | None
    ) -> None:
        await self._execute(
            "recording the job's end", "finish", election, run, status.value, exit_code
        )

    async def interrupt(self, election: str, run: int, below_term: int) -> None:
        await self._execute("recording the job's end", "interrupt", election, run, below_term)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await close_quietly(conn)

    async def _execute(self, doing: str, sql: str, *args: Any) -> None:
        async with self._session(doing) as conn:
            await conn.execute(self._sql[sql], *args)

    async def _fetchrow(self, doing: str, sql: str, *args: Any) -> Any:
        async with self._session(doing) as conn:
            return await conn.fetchrow(self._sql[sql], *args)

    @contextlib.asynccontextmanager
    async def _session(self, doing: str) -> Any:
        """The one connection, within the error boundary; a broken one is replaced."""
        async with self._lock, request(self._pg, doing, _TIMEOUT):
            if self._conn is None or self._conn.is_closed():
                self._conn = await connect(self._pg, _TIMEOUT)
            try:
                yield self._conn
            except BaseException:
                conn, self._conn = self._conn, None
                conn.terminate()
                raise


def _record(election: str, row: Any) -> JobRecord:
    if row["runs"] is None:
        return JobRecord(election, row["now"])
    status = RunStatus(row["status"]) if row["status"] else None
    return JobRecord(election, row["now"], int(row["runs"]), row["started_at"], row["started_by"],
                     int(row["term"]), row["ended_at"], status, row["exit_code"],
                     row["succeeded_at"], row["first_started_at"])  # fmt: skip
