"""`leaderd run --once-per PERIOD -- JOB`: the leader runs JOB at most once per PERIOD across
the cluster (docs/run.md, "Once per period").

The record lives in the backend (backends/jobs.py): before JOB starts, its start is written
durably, fenced on this process's lease and term and conditioned on the record as read, so a
new leader after a failover reads it and waits for the next due time instead of running
JOB again. JOB runs exactly like `run -- COMMAND`'s child (supervisor.py): stopped before
the lease can expire, its whole tree with it. Its end and exit status are written after.

Due times are judged on the backend's clock: the last recorded start plus PERIOD. A leader
that comes late (a failover at the due time) runs JOB at once; after an outage longer than
a whole PERIOD, JOB waits for the next point of its schedule (``last start + n * PERIOD``),
or with ``catch_up`` runs once at once, however many periods were missed.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..backends.base import BackendError
from ..backends.jobs import JobRecord, JobStore, RunStatus
from ..clock import boottime
from ..events import Event, extra
from .supervisor import Supervisor

if TYPE_CHECKING:
    from ..election.engine import Election

log = logging.getLogger("leaderd.supervisor")

_RETRY = 1.0  # after a failed read or write of the record
_REFRESH_MAX = 30.0  # a follower reads the record at least this often, for GET /jobs


def due_in(record: JobRecord, period: float, catch_up: bool) -> float:
    """Seconds (backend clock) until JOB is due; 0 when it is due now."""
    if record.started_at is None:
        return 0.0
    late = record.now - (record.started_at + period)
    if late < 0:
        return -late
    if late < period or catch_up:
        return 0.0
    return period - late % period  # an outage missed a whole period: the schedule's next point


class OncePer(Supervisor):
    """Runs JOB on the leader when due, and records each run in the backend."""

    def __init__(
        self,
        command: list[str],
        election: Election,
        store: JobStore,
        *,
        period: float,
        catch_up: bool,
        kill_grace: float,
        socket_path: str = "",
    ) -> None:
        super().__init__(command, election, kill_grace=kill_grace, socket_path=socket_path)
        self.store, self.period, self.catch_up = store, period, catch_up
        self.record: JobRecord | None = None  # as last read, for GET /jobs and the metrics
        self.on_run: Callable[[RunStatus, float], None] | None = None  # the metrics' hook
        self._refreshed = float("-inf")
        self._recorded = asyncio.Event()  # set while no run's end is left to record
        self._recorded.set()

    async def _supervise(self) -> int | None:
        while True:
            term, _deadline = await self._until_leading()
            record = await self._when_due(term)
            if record is None:
                continue  # leadership changed while waiting
            started = await self._start(term, record)
            lease = self._election.lease_deadline()
            if started is None or lease is None or lease[0] != term:
                continue
            began = boottime()
            at = f"{started.started_at or 0.0:.3f}"  # on the backend's clock, as scheduled
            self.child_env = {"LEADERD_JOB_RUN": str(started.runs), "LEADERD_JOB_STARTED_AT": at}
            self._recorded.clear()
            try:
                code = await self._run_once(term, lease[1])
                await self._finish(started.runs, code, boottime() - began)
            finally:
                self._recorded.set()

    async def stop_child(self, election: str) -> None:
        """The step-down hook: the job's tree is gone and its end recorded before the release,
        so the next leader reads how it ended (not a run it would mark interrupted)."""
        await super().stop_child(election)
        await self._recorded.wait()

    async def _until_leading(self) -> tuple[int, float]:
        """As for any child, and meanwhile keep the record fresh for GET /jobs."""
        while True:
            lease = self._election.lease_deadline()
            if lease is not None and lease[1] - boottime() > self.kill_grace:
                return lease
            if boottime() - self._refreshed >= min(self.period, _REFRESH_MAX):
                await self._read()
            status = self._election.status()
            await self._election.wait_for_change(status.revision, 0.1 if status.is_leader else 1.0)

    async def _when_due(self, term: int) -> JobRecord | None:
        """Wait, while leading with ``term``, until JOB is due: the record read then."""
        # The point waited for (runs, backend time): read again at that point of the schedule,
        # due_in would name the next one, a period on, and so on for ever.
        point = (-1, 0.0)
        while self._leads_with(term):
            record = await self._read()
            if record is None:
                await asyncio.sleep(_RETRY)
                continue
            if record.status is RunStatus.RUNNING and record.term < term:
                await self._interrupt(record, term)
                continue
            wait = due_in(record, self.period, self.catch_up)
            # Due now only by --catch-up: the schedule alone would wait for its next point.
            caught_up = wait <= 0 and due_in(record, self.period, False) > 0
            if point[0] == record.runs and record.now >= point[1]:
                wait = 0.0
            if wait <= 0:
                if caught_up:
                    self._say_caught_up(record)
                return record
            if point[0] != record.runs:
                point = (record.runs, record.now + wait)
            status = self._election.status()
            await self._election.wait_for_change(status.revision, min(wait, _REFRESH_MAX))
        return None

    def _say_caught_up(self, record: JobRecord) -> None:
        # Why a run starts now, not at the schedule's point: an operator's (and a test's) cue.
        missed = int((record.now - (record.started_at or record.now)) // self.period) - 1
        log.info("job %s: %d period(s) missed, running it at once (--catch-up)",
                 self._name, missed)  # fmt: skip

    async def _start(self, term: int, record: JobRecord) -> JobRecord | None:
        """Record the start durably: the record if this process's write took."""
        me = self._election.candidate
        try:
            started = await self.store.start(self._election.name, me, term, record.runs)
        except BackendError as exc:
            log.warning("cannot record the start of job %s: %s", self._name, exc)
            await asyncio.sleep(_RETRY)
            return None
        self.record = started
        if (started.runs, started.term, started.started_by) != (record.runs + 1, term, me.node_id):
            log.info("job %s was not started: the record changed (run %d by %s, term %d)",
                     self._name, started.runs, started.started_by or "-", started.term)  # fmt: skip
            return None
        log.info("job %s: run %d recorded, starting it (election %s, term %d)",
                 self._name, started.runs, self._election.name, term,
                 extra=extra(Event.CHILD_STARTED, term=term))  # fmt: skip
        return started

    async def _finish(self, run: int, code: int | None, seconds: float) -> None:
        status = _status_of(code)
        if self.on_run is not None:
            self.on_run(status, seconds)
        log.info("job %s: run %d %s after %.1fs", self._name, run, status.value, seconds)
        try:
            await self.store.finish(self._election.name, run, status, code)
        except BackendError as exc:  # the next leader marks it interrupted
            log.warning("cannot record the end of job %s run %d: %s", self._name, run, exc)
        await self._read()

    async def _interrupt(self, record: JobRecord, term: int) -> None:
        try:
            await self.store.interrupt(self._election.name, record.runs, term)
        except BackendError as exc:
            log.warning("cannot record job %s run %d interrupted: %s", self._name, record.runs, exc)
            await asyncio.sleep(_RETRY)

    async def _read(self) -> JobRecord | None:
        self._refreshed = boottime()
        try:
            self.record = await self.store.read(self._election.name)
        except BackendError as exc:
            log.warning("cannot read the record of job %s: %s", self._name, exc)
            return None
        return self.record

    def _leads_with(self, term: int) -> bool:
        lease = self._election.lease_deadline()
        return lease is not None and lease[0] == term and lease[1] - boottime() > self.kill_grace

    @property
    def _name(self) -> str:
        return shlex.join(self.command)


def _status_of(code: int | None) -> RunStatus:
    if code is None:
        return RunStatus.STOPPED
    return RunStatus.SUCCEEDED if code == 0 else RunStatus.FAILED
