"""The Lease object an election lives in, read and written as client-go does, plus leaderd's
annotations (docs/kubernetes.md, "The Lease"):

* ``spec`` is what client-go and ``kubectl get lease -o yaml`` read: holderIdentity (the node
  id; "" once released), leaseDurationSeconds (the ttl rounded up), acquireTime, renewTime
  (MicroTime, written by the holder's wall clock: display only, never judged) and
  leaseTransitions (+1 whenever the holder identity changes, client-go's rule).
* ``leaderd.io/term``: the last term granted. A Lease that does not exist yet starts at the
  wall clock in milliseconds, so a Lease deleted and created again never repeats a term.
* ``leaderd.io/holder``: the holder's instance, address and exact ttl, bound to the spec by the
  holderIdentity and renewTime it was written with: a client-go holder that writes the spec
  (keeping the annotations) is never mistaken for the leaderd holder before it.
* ``leaderd.io/history``: the newest HISTORY_RETENTION tenures, written by the very update that
  changes the holder.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from ...clock import wall_time
from ..base import Candidate
from ..records import HISTORY_RETENTION, Tenure

TERM, HOLDER, HISTORY = "leaderd.io/term", "leaderd.io/holder", "leaderd.io/history"
API_VERSION = "coordination.k8s.io/v1"
# A holder whose Lease names no duration is waited out as client-go's default would.
DEFAULT_DURATION = 15.0


def micro_time(when: dt.datetime) -> str:
    """Kubernetes' MicroTime: RFC 3339 in UTC with exactly six fractional digits."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: Any) -> dt.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def now_wall() -> dt.datetime:
    return dt.datetime.fromtimestamp(wall_time(), dt.UTC)


def first_term() -> int:
    """A new Lease's term floor: above any term a deleted Lease of the same name granted."""
    return int(wall_time() * 1000)


@dataclass(frozen=True)
class Record:
    """One Lease as the API server answered it."""

    raw: dict[str, Any] = field(repr=False, compare=False)
    version: str  # metadata.resourceVersion: the compare-and-swap's condition
    holder: str | None  # spec.holderIdentity; None when free
    instance: str  # from a bound holder annotation; "" for a holder that is not leaderd
    address: str
    term: int
    duration: float  # how long the holder's lease lasts after a write: the takeover wait
    acquired_at: dt.datetime | None
    transitions: int
    history: tuple[dict[str, Any], ...] = field(compare=False)

    def mine(self, candidate: Candidate) -> bool:
        return self.holder == candidate.node_id and self.instance == candidate.instance


def decode(raw: dict[str, Any]) -> Record:
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    notes = meta.get("annotations") or {}
    holder = str(spec.get("holderIdentity") or "") or None
    bound = _bound_holder(notes, holder, spec.get("renewTime"))
    seconds = _number(spec.get("leaseDurationSeconds"))
    duration = float(bound.get("ttl", seconds)) if bound else seconds
    return Record(
        raw=raw,
        version=str(meta.get("resourceVersion", "")),
        holder=holder,
        instance=str(bound.get("instance", "")),
        address=str(bound.get("address", "")),
        term=int(_number(notes.get(TERM))),
        duration=duration if duration > 0 else DEFAULT_DURATION,
        acquired_at=parse_time(spec.get("acquireTime")) if holder else None,
        transitions=int(_number(spec.get("leaseTransitions"))),
        history=_history(notes.get(HISTORY)),
    )


def _bound_holder(notes: dict[str, Any], holder: str | None, renewed: Any) -> dict[str, Any]:
    """leaderd's holder annotation, only while the spec is still the one it was written with."""
    try:
        value = orjson.loads(notes.get(HOLDER) or "{}")
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(value, dict) or holder is None:
        return {}
    if value.get("node") != holder or value.get("renew") != renewed:
        return {}
    return value


def _history(text: Any) -> tuple[dict[str, Any], ...]:
    try:
        value = orjson.loads(text or "[]")
    except (orjson.JSONDecodeError, TypeError):
        return ()
    return tuple(r for r in value if isinstance(r, dict)) if isinstance(value, list) else ()


def _number(value: Any) -> float:
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


def new_lease(name: str, term: int) -> dict[str, Any]:
    """A free Lease carrying its first term (open() creates one per election)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Lease",
        "metadata": {"name": name, "annotations": {TERM: str(term)}},
        "spec": {"holderIdentity": "", "leaseTransitions": 0},
    }


def held(
    record: Record | None,
    name: str,
    candidate: Candidate,
    ttl: float,
    term: int,
    now: str,
    history: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The object that makes ``candidate`` the holder at ``now`` (a MicroTime): an
    acquisition when ``term`` differs from the record's (acquireTime, leaseTransitions and
    history move), else a renewal."""
    raw = copy.deepcopy(record.raw) if record is not None else new_lease(name, term)
    spec, notes = raw.setdefault("spec", {}), _annotations(raw)
    acquiring = record is None or record.term != term or not record.mine(candidate)
    if acquiring:
        previous = str(spec.get("holderIdentity") or "")
        if record is not None and previous != candidate.node_id:
            spec["leaseTransitions"] = record.transitions + 1
        spec.setdefault("leaseTransitions", 0)
        spec["acquireTime"] = now
    spec.update(
        holderIdentity=candidate.node_id, leaseDurationSeconds=max(1, math.ceil(ttl)), renewTime=now
    )
    notes[TERM] = str(term)
    holder = {
        "node": candidate.node_id,
        "instance": candidate.instance,
        "address": candidate.address,
        "ttl": ttl,
        "term": term,
        "renew": now,
    }
    notes[HOLDER] = orjson.dumps(holder).decode()
    if history is not None:
        notes[HISTORY] = orjson.dumps(history[:HISTORY_RETENTION]).decode()
    return raw


def released(record: Record, now: str, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The holder gone and the term kept, as client-go's ReleaseOnCancel writes it."""
    raw = copy.deepcopy(record.raw)
    spec, notes = raw.setdefault("spec", {}), _annotations(raw)
    spec.update(holderIdentity="", leaseDurationSeconds=1, acquireTime=now, renewTime=now)
    notes.pop(HOLDER, None)
    notes[HISTORY] = orjson.dumps(history[:HISTORY_RETENTION]).decode()
    return raw


def with_history(record: Record, history: list[dict[str, Any]]) -> dict[str, Any]:
    raw = copy.deepcopy(record.raw)
    _annotations(raw)[HISTORY] = orjson.dumps(history[:HISTORY_RETENTION]).decode()
    return raw


def _annotations(raw: dict[str, Any]) -> dict[str, Any]:
    meta = raw.setdefault("metadata", {})
    notes = meta.get("annotations")
    if isinstance(notes, dict):
        return notes
    fresh: dict[str, Any] = {}
    meta["annotations"] = fresh
    return fresh


def tenure_record(candidate: Candidate, term: int, acquired_at: str) -> dict[str, Any]:
    return {
        "term": term,
        "holder": candidate.node_id,
        "instance": candidate.instance,
        "address": candidate.address,
        "acquired": acquired_at,
        "ended": None,
        "reason": None,
    }


def tenures(election: str, history: tuple[dict[str, Any], ...], limit: int) -> list[Tenure]:
    return [
        Tenure(
            election=election,
            term=int(_number(r.get("term"))),
            holder=str(r.get("holder", "")),
            instance=str(r.get("instance", "")),
            address=str(r.get("address", "")),
            acquired_at=parse_time(r.get("acquired")),
            ended_at=parse_time(r.get("ended")),
            end_reason=r.get("reason") if isinstance(r.get("reason"), str) else None,
        )
        for r in history[: max(0, limit)]
    ]
