"""The record of `run --once-per` jobs: one row per election, beside the lease (docs/run.md,
"Once per period").

A narrow store of its own, next to the lease backend rather than in its interface: only a
daemon that runs a job opens one. Its contract:

* ``start`` records a new run durably, and only if the candidate holds the election's lease
  with ``term``, unexpired on the backend's clock, and the record still has ``runs`` starts
  (a compare-and-set): two daemons can never both record the start that follows one record.
* Times are the backend's clock (PostgreSQL's ``now()``, the host's wall clock for SQLite),
  each read with the record (``JobRecord.now``), so a due time is judged on one clock. etcd
  and Kubernetes keep no clock a client can read: their stores use the writing host's wall
  clock (etcd/jobs.py says why that is safe).
* Driver exceptions never escape: they become BackendError, as for the lease backends.
"""

from __future__ import annotations

import abc
import enum
import importlib
from dataclasses import dataclass

from .base import BackendFatal, Candidate


class RunStatus(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # exited with a status other than 0, or killed by a signal of its own
    STOPPED = "stopped"  # stopped by leaderd: leadership lost or about to be, or shutdown
    # Still "running" under an older term when a new leader read it: its leader is gone, and
    # the lease's end ended its tree (rule 12), so it will never say how it finished.
    INTERRUPTED = "interrupted"


@dataclass(frozen=True, slots=True)
class JobRecord:
    """An election's job record as the backend saw it, all times in backend seconds."""

    election: str
    now: float  # the backend's clock when it answered
    runs: int = 0  # recorded starts, ever; 0 when never started
    started_at: float | None = None  # the last recorded start
    started_by: str = ""  # its node id
    term: int = 0  # the term it started under
    ended_at: float | None = None
    status: RunStatus | None = None  # of the last run; None when never started
    exit_code: int | None = None
    succeeded_at: float | None = None  # when the last successful run ended
    first_started_at: float | None = None  # the first recorded start, ever


class JobStore(abc.ABC):
    """The job records of one backend's elections."""

    @abc.abstractmethod
    async def open(self) -> None:
        """Create the jobs table if it is missing; BackendFatal if it never can."""

    @abc.abstractmethod
    async def read(self, election: str) -> JobRecord:
        """The record (runs 0 when there is none), with the backend's now."""

    @abc.abstractmethod
    async def start(self, election: str, candidate: Candidate, term: int, runs: int) -> JobRecord:
        """Record run ``runs + 1`` as started now by ``candidate`` under ``term``, durably,
        if the candidate still holds the lease with that term and the record still has
        ``runs`` starts. The record either way: it was written iff its ``runs`` is
        ``runs + 1`` and its ``term`` is ``term`` and it names the candidate."""

    @abc.abstractmethod
    async def finish(
        self, election: str, run: int, status: RunStatus, exit_code: int | None
    ) -> None:
        """End run ``run`` with ``status``, if it is still recorded as running."""

    @abc.abstractmethod
    async def interrupt(self, election: str, run: int, below_term: int) -> None:
        """Mark run ``run`` interrupted if it is still running under a term below ``below_term``."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close connections. Idempotent."""


# scheme -> (module, class): the backends that can keep job records.
_STORES = {
    "sqlite": ("leaderd.backends.sqlite.jobs", "SQLiteJobStore"),
    "postgresql": ("leaderd.backends.postgres.jobs", "PostgresJobStore"),
    "postgres": ("leaderd.backends.postgres.jobs", "PostgresJobStore"),
    "postgresql+advisory": ("leaderd.backends.postgres.advisory_jobs", "AdvisoryJobStore"),
    "postgres+advisory": ("leaderd.backends.postgres.advisory_jobs", "AdvisoryJobStore"),
    "etcd": ("leaderd.backends.etcd.jobs", "EtcdJobStore"),
    "etcd+https": ("leaderd.backends.etcd.jobs", "EtcdJobStore"),
    "kubernetes": ("leaderd.backends.kubernetes.jobs", "KubernetesJobStore"),
}


def supports_jobs(url: str) -> bool:
    return url.split(":", 1)[0].lower() in _STORES


def job_store_from_url(url: str) -> JobStore:
    """The job store beside the lease table a backend URL names (not opened)."""
    scheme = url.split(":", 1)[0].lower()
    if scheme not in _STORES:
        raise BackendFatal(
            f"run --once-per keeps its record in the lease's backend; {scheme}:// keeps none"
        )
    module_name, class_name = _STORES[scheme]
    cls = getattr(importlib.import_module(module_name), class_name)
    store: JobStore = cls.from_url(url)
    return store
