"""`run --once-per` job records on Kubernetes (backends/jobs.py, docs/run.md): the record is
the ``leaderd.io/job`` annotation (JSON) of the election's own Lease.

The API server writes an object only by compare-and-swap on its resourceVersion, and only
within one object, so the record lives in the very object whose holder it must be fenced
on. A start reads the Lease and writes it back, the annotation changed and the spec as read,
with the resourceVersion it read: it is refused (409) if anyone wrote the Lease meanwhile:
a standby that took it over, a renewal, or another start. It is written only if the Lease
read names this process (holderIdentity and the bound holder annotation) with the term, its
last renewal (written by this very process's wall clock, so compared with the same clock)
younger than its ttl, and the record read still has ``runs`` starts. A takeover is a write
of the Lease, so a start that was written came before it, and the new holder reads it.

Renewals and releases rewrite the Lease from the object last seen (the watch shows them this
write), keeping every annotation, so the record survives them; a renewal that raced with a
job write gets a 409, reads again and renews, and a release that names the version of its
last renewal still applies after a job's write, which leaves renewTime as it was
(backend.py). A write of the record counts as a change of the Lease for the standbys'
takeover rule: it makes them wait longer, never less.

Times are the writing host's wall clock, as for etcd (etcd/jobs.py says why that is safe):
the API server keeps no time a client can read with sub-second precision.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from ...clock import wall_time
from .. import job_json
from ..base import Candidate
from ..jobs import JobRecord, RunStatus
from . import codec
from .config import KubeSettings
from .transport import Conflict, KubeClient

JOB = "leaderd.io/job"
_TIMEOUT = 5.0


class KubernetesJobStore(job_json.WholeRecordStore):
    def __init__(self, settings: KubeSettings) -> None:
        self._settings = settings
        self._client = KubeClient(settings)
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{settings.namespace}/leases"

    @classmethod
    def from_url(cls, url: str) -> KubernetesJobStore:
        return cls(KubeSettings.from_url(url))

    async def open(self) -> None:
        """Nothing to create: the Lease is the election's (the backend creates it)."""

    async def read(self, election: str) -> JobRecord:
        return _record(election, await self._get(election))

    async def start(self, election: str, candidate: Candidate, term: int, runs: int) -> JobRecord:
        raw = await self._get(election)
        record = _record(election, raw)
        if raw is None or record.runs != runs or not _holds(raw, candidate, term):
            return record
        started = job_json.started(record, candidate, term)
        try:
            await self._put(election, raw, started)
        except Conflict:  # the Lease moved since it was read: read what it says now
            return await self.read(election)
        return started

    async def close(self) -> None:
        await self._client.close()

    async def _ended(
        self, election: str, run: int, status: RunStatus, code: int | None, below_term: int
    ) -> bool:
        raw = await self._get(election)
        ended = job_json.ended(_record(election, raw), run, status, code, below_term)
        if raw is None or ended is None:
            return True
        try:
            await self._put(election, raw, ended)
        except Conflict:
            return False
        return True

    def _lease(self, election: str) -> str:
        return f"{self._path}/{self._settings.lease_name(election)}"

    async def _get(self, election: str) -> dict[str, Any] | None:
        answer = await self._client.request("GET", self._lease(election), _TIMEOUT)
        return None if answer.status == 404 else dict(answer.body)

    async def _put(self, election: str, raw: dict[str, Any], record: JobRecord) -> None:
        """Write ``record`` into the Lease as read (its resourceVersion: the condition)."""
        raw = copy.deepcopy(raw)
        notes = raw.setdefault("metadata", {}).setdefault("annotations", {})
        notes[JOB] = job_json.encode(record).decode()
        answer = await self._client.request("PUT", self._lease(election), _TIMEOUT, raw)
        if answer.status == 404:
            raise Conflict(f"PUT {self._lease(election)}: the Lease was deleted")


def _record(election: str, raw: dict[str, Any] | None) -> JobRecord:
    notes = ((raw or {}).get("metadata") or {}).get("annotations") or {}
    return job_json.decode(election, notes.get(JOB))


def _holds(raw: dict[str, Any], candidate: Candidate, term: int) -> bool:
    """The Lease names ``candidate`` with ``term``, renewed by it less than its ttl ago."""
    lease = codec.decode(raw)
    if not lease.mine(candidate) or lease.term != term:
        return False
    notes = (raw.get("metadata") or {}).get("annotations") or {}
    holder = orjson.loads(notes.get(codec.HOLDER) or "{}")
    renewed = codec.parse_time(holder.get("renew"))
    return renewed is not None and renewed.timestamp() + lease.duration > wall_time()
