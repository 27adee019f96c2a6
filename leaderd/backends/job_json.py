"""A job record as JSON, for the stores that keep it in one value (etcd's job key, the
Kubernetes Lease's annotation) and write it whole by compare-and-set (backends/jobs.py)."""

from __future__ import annotations

import abc
from dataclasses import asdict, replace

import orjson

from ..clock import wall_time
from .base import Candidate
from .jobs import JobRecord, JobStore, RunStatus


class WholeRecordStore(JobStore):
    """A store that writes the whole record by compare-and-set: an end is read, changed and
    written back, again if another write came between."""

    RACES = 3  # an end's write that lost to another write (a renewal) reads again this often

    async def finish(
        self, election: str, run: int, status: RunStatus, exit_code: int | None
    ) -> None:
        await self._end(election, run, status, exit_code, 0)

    async def interrupt(self, election: str, run: int, below_term: int) -> None:
        await self._end(election, run, RunStatus.INTERRUPTED, None, below_term)

    async def _end(
        self, election: str, run: int, status: RunStatus, code: int | None, below_term: int
    ) -> None:
        for _ in range(self.RACES):
            if await self._ended(election, run, status, code, below_term):
                return

    @abc.abstractmethod
    async def _ended(
        self, election: str, run: int, status: RunStatus, code: int | None, below_term: int
    ) -> bool:
        """One try at ending the run (``ended`` says how): False when another write came
        first, so that it is read again."""


def encode(record: JobRecord) -> bytes:
    value = {k: v for k, v in asdict(record).items() if k not in ("election", "now")}
    value["status"] = record.status.value if record.status else None
    return orjson.dumps(value)


def decode(election: str, text: str | bytes | None) -> JobRecord:
    """The record a value holds, read now; a missing (or unreadable) one has no runs."""
    now = wall_time()
    try:
        value = orjson.loads(text or b"")
        status = RunStatus(value["status"]) if value.get("status") else None
        return JobRecord(election, now, int(value["runs"]), value.get("started_at"),
                         str(value.get("started_by", "")), int(value.get("term", 0)),
                         value.get("ended_at"), status, value.get("exit_code"),
                         value.get("succeeded_at"), value.get("first_started_at"))  # fmt: skip
    except (KeyError, ValueError, TypeError, AttributeError):
        return JobRecord(election, now)


def started(record: JobRecord, candidate: Candidate, term: int) -> JobRecord:
    """The record of the next run, started now (this host's wall clock)."""
    wall = wall_time()
    first = record.first_started_at if record.runs else wall
    return replace(record, now=wall, runs=record.runs + 1, started_at=wall,
                   started_by=candidate.node_id, term=term, ended_at=None,
                   status=RunStatus.RUNNING, exit_code=None, first_started_at=first)  # fmt: skip


def ended(
    record: JobRecord, run: int, status: RunStatus, exit_code: int | None, below_term: int = 0
) -> JobRecord | None:
    """Run ``run`` ended now with ``status``; None when the record is not that run still
    running (or, with ``below_term``, runs under a term at or above it)."""
    if record.runs != run or record.status is not RunStatus.RUNNING:
        return None
    if below_term and record.term >= below_term:
        return None
    wall = wall_time()
    succeeded = wall if status is RunStatus.SUCCEEDED else record.succeeded_at
    return replace(record, now=wall, ended_at=wall, status=status, exit_code=exit_code,
                   succeeded_at=succeeded)  # fmt: skip
