"""`run --once-per` job records in etcd (backends/jobs.py, docs/run.md): one key per
election, ``<prefix><election>/job``, holding the record as JSON, under no lease.

A start is read, then ONE transaction: it puts the record only if the leader key still has
the mod revision it was read with while naming this process with the term (the same
tenure: a renewal keeps it, any other write moves it) and is still attached to that etcd
lease (a lease that ended took the key with it: etcd's lessor deletes both at once), and
only if the job key still has the mod revision it had when it showed ``runs`` starts (a
compare-and-set on the count: every write of the record moves it). Ends are the same
compare-and-set on the job key alone.

Times are the writing host's wall clock (Unix seconds), as for SQLite: etcd keeps no time a
client can read (its lessor's clock is private, and the leader key's lease says only how
much is left). The rule "the last recorded start is older than PERIOD" is judged by the
leader of the moment against a start another host may have recorded, so a period's
boundary moves by the offset between the two hosts' wall clocks (NTP keeps it to
milliseconds; a period is seconds at the least). The clock never decides who may start: two
daemons can never both record the start that follows one record, whatever the clocks say,
and a start is recorded only within the holder's tenure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import job_json
from ..base import Candidate
from ..jobs import JobRecord, RunStatus
from .gateway import EtcdClient, EtcdSettings, b64, unb64
from .state import compare, holder_of, int_of

_TIMEOUT = 5.0


@dataclass(frozen=True)
class _Read:
    """The job key as one transaction read it, with the leader key beside it."""

    record: JobRecord
    job_modified: int  # the job key's mod revision; 0 while it does not exist
    leader: dict[str, Any]  # the leader key's kv; {} when nobody holds the lease


class EtcdJobStore(job_json.WholeRecordStore):
    def __init__(self, settings: EtcdSettings) -> None:
        self._etcd = EtcdClient(settings)
        self._prefix = settings.prefix

    @classmethod
    def from_url(cls, url: str) -> EtcdJobStore:
        return cls(EtcdSettings.from_url(url))

    async def open(self) -> None:
        """Nothing to create: the key is put by the first start."""

    async def read(self, election: str) -> JobRecord:
        return (await self._read(election)).record

    async def start(self, election: str, candidate: Candidate, term: int, runs: int) -> JobRecord:
        seen = await self._read(election)
        holder = holder_of(seen.leader) if seen.leader else None
        me = (candidate.node_id, candidate.instance, term)
        if holder is None or (holder.node_id, holder.instance, holder.term) != me:
            return seen.record
        if seen.record.runs != runs:
            return seen.record
        leader = b64(self._key(election, "leader"))
        held = [  # the same tenure, and still under its etcd lease
            compare(leader, "MOD", holder.modified),
            {"key": leader, "target": "LEASE", "result": "EQUAL", "lease": str(holder.lease)},
        ]
        record = job_json.started(seen.record, candidate, term)
        _written, now = await self._put(election, record, seen.job_modified, held, "starting")
        return now

    async def close(self) -> None:
        await self._etcd.close()

    def _key(self, election: str, what: str) -> str:
        return f"{self._prefix}{election}/{what}"

    async def _ended(
        self, election: str, run: int, status: RunStatus, code: int | None, below_term: int
    ) -> bool:
        seen = await self._read(election)
        ended = job_json.ended(seen.record, run, status, code, below_term)
        if ended is None:
            return True
        written, _now = await self._put(election, ended, seen.job_modified, [], "ending")
        return written

    async def _read(self, election: str) -> _Read:
        keys = (self._key(election, "job"), self._key(election, "leader"))
        ranges = [{"request_range": {"key": b64(key)}} for key in keys]
        answer = await self._etcd.call(
            "/v3/kv/txn", {"success": ranges}, _TIMEOUT, "reading the job record"
        )
        job, leader = (_kv(r) for r in answer.get("responses", [{}, {}]))
        return _Read(_decode(election, job), int_of(job.get("mod_revision")), leader)

    async def _put(
        self,
        election: str,
        record: JobRecord,
        job_modified: int,
        held: list[dict[str, Any]],
        doing: str,
    ) -> tuple[bool, JobRecord]:
        """Put ``record`` if the job key is still at ``job_modified`` and ``held`` holds:
        whether it was, and the record as it is after the transaction either way."""
        key = b64(self._key(election, "job"))
        body = {
            "compare": [compare(key, "MOD", job_modified), *held],
            "success": [{"request_put": {"key": key, "value": b64(job_json.encode(record))}}],
            "failure": [{"request_range": {"key": key}}],
        }
        answer = await self._etcd.call("/v3/kv/txn", body, _TIMEOUT, f"{doing} the job's run")
        if answer.get("succeeded"):
            return True, record
        return False, _decode(election, _kv((answer.get("responses") or [{}])[0]))


def _kv(response: dict[str, Any]) -> dict[str, Any]:
    kvs: list[dict[str, Any]] = response.get("response_range", {}).get("kvs") or [{}]
    return kvs[0]


def _decode(election: str, kv: dict[str, Any]) -> JobRecord:
    return job_json.decode(election, unb64(kv["value"]) if kv.get("value") else None)
