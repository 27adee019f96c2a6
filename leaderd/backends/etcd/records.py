"""The etcd members and history keys (docs/etcd.md): operations that join the transactions
the etcd backend already sends, so they add no request.

* ``<prefix><election>/members/<node id>/<instance>``: a member's JSON, put by each of its
  rounds. etcd keeps no time for a key, so its age is judged as the takeover rule judges a
  lease (rule 3, docs/algorithm.md): on this daemon's own clock, since it saw the key's mod revision
  change. A key unchanged for PRUNE_AFTER_TTLS of its ttl is deleted if still unchanged.
* ``<prefix><election>/candidates/<node id>/<instance>``: a campaigning standby's spare
  lease id, put when its spare changes, deleted when it stops campaigning or acquires: what a
  release may grant the lease under (grant.py).
* ``<prefix><election>/history/<term>``: a holder's record, put by the transaction that
  began the term. An acquisition also deletes the records HISTORY_RETENTION terms older; a
  grant leaves that to the heir's first renewal, since the heir would wait for the range
  deletes, which walk every deleted key etcd has not compacted yet. Reads show no record
  older than the retention.
* ``<prefix><election>/ended/<term>``: how it ended, put by the releasing transaction (or
  by the holder that lost etcd, at its next round). A term with no such key whose key
  etcd's lessor deleted ended "expired" when the next term began.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import orjson

from ...clock import boottime
from ..base import Candidate
from ..records import HISTORY_RETENTION, PRUNE_AFTER_TTLS, EndReason, Member, Tenure
from .gateway import b64, prefix_end, unb64

_DIGITS = 20  # terms are zero-padded, so keys sort as terms do


def now() -> str:
    """The wall clock as the records show it (milliseconds, UTC)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _put(key: str, value: Any) -> dict[str, Any]:
    return {"request_put": {"key": b64(key), "value": b64(orjson.dumps(value))}}


def _range(prefix: str, **options: Any) -> dict[str, Any]:
    return {"request_range": {"key": b64(prefix), "range_end": prefix_end(prefix), **options}}


@dataclass(frozen=True)
class Keys:
    """The records' keys of one election."""

    base: str  # <prefix><election>/

    @property
    def leader(self) -> str:
        """The election's key: who leads, under the leader's etcd lease."""
        return f"{self.base}leader"

    @property
    def term(self) -> str:
        """The term counter: the last term any node began."""
        return f"{self.base}term"

    @property
    def reserved(self) -> str:
        """A reservation: the node id that alone may acquire the free lease (state.py)."""
        return f"{self.base}reserved"

    @property
    def members(self) -> str:
        return f"{self.base}members/"

    def member(self, me: Candidate) -> str:
        return f"{self.members}{me.node_id}/{me.instance}"

    @property
    def candidates(self) -> str:
        return f"{self.base}candidates/"

    def candidate(self, node_id: str, instance: str) -> str:
        return f"{self.candidates}{node_id}/{instance}"

    def history(self, term: int) -> str:
        return f"{self.base}history/{term:0{_DIGITS}d}"

    def ended(self, term: int) -> str:
        return f"{self.base}ended/{term:0{_DIGITS}d}"

    # ---- operations for the backend's transactions ----

    def heard(self, me: Candidate, ttl: float, heard_at: str, campaigning: bool) -> dict[str, Any]:
        value = {"node_id": me.node_id, "instance": me.instance, "address": me.address,
                 "version": me.leaderd_version, "ttl": ttl, "heard_at": heard_at,
                 "campaigning": campaigning, "priority": me.priority,
                 "health": me.health, "switchover": me.switchover}  # fmt: skip
        return _put(self.member(me), value)

    def list_members(self) -> dict[str, Any]:
        return _range(self.members)

    def stand(self, me: Candidate, spare: int, ttl: float) -> dict[str, Any]:
        """Offer ``spare`` as the lease a release may grant this candidate the election under;
        with the candidate's ``ttl``, which the heir rule judges its heartbeat's age by."""
        value = {"node_id": me.node_id, "instance": me.instance, "address": me.address,
                 "lease": str(spare), "priority": me.priority, "ttl": ttl}  # fmt: skip
        return _put(self.candidate(me.node_id, me.instance), value)

    def withdraw(self, me: Candidate) -> dict[str, Any]:
        return {"request_delete_range": {"key": b64(self.candidate(me.node_id, me.instance))}}

    def list_candidates(self) -> dict[str, Any]:
        return _range(self.candidates)

    def read_ended(self, term: int) -> dict[str, Any]:
        return {"request_range": {"key": b64(self.ended(term))}}

    def released_in(self, answer: Any, term: int) -> bool:
        """Whether ``answer``'s ranges hold ``term``'s end record, put by its release (a
        lost term's record comes later, from its holder's next round: no release)."""
        key = self.ended(term)
        for r in answer.get("responses", []):
            for kv in r.get("response_range", {}).get("kvs") or []:
                if unb64(kv.get("key", "")).decode(errors="replace") == key:
                    return _a_release(kv)
        return False

    def lost(self, term: int) -> dict[str, Any]:
        return _put(self.ended(term), {"end_reason": EndReason.LOST_BACKEND, "ended_at": None})

    def released(self, term: int, reason: str) -> dict[str, Any]:
        return _put(self.ended(term), {"end_reason": reason, "ended_at": now()})

    def began(self, me: Candidate, term: int, acquired_at: str) -> dict[str, Any]:
        """Record the new term."""
        value = {"holder": me.node_id, "instance": me.instance, "address": me.address,
                 "acquired_at": acquired_at}  # fmt: skip
        return _put(self.history(term), value)

    def trimmed(self, term: int) -> list[dict[str, Any]]:
        """Delete the records HISTORY_RETENTION terms older than ``term``."""
        oldest = max(0, term - HISTORY_RETENTION + 1)
        return [
            {"request_delete_range": {"key": b64(start(0)), "range_end": b64(start(oldest))}}
            for start in (self.history, self.ended)
        ]

    def listed(self, answer: Any) -> list[dict[str, Any]]:
        """The member keys a transaction's ranges returned."""
        return [
            kv
            for r in answer.get("responses", [])
            for kv in r.get("response_range", {}).get("kvs") or []
            if unb64(kv.get("key", "")).decode(errors="replace").startswith(self.members)
        ]

    def read_history(self, limit: int) -> list[dict[str, Any]]:
        newest = {"sort_order": "DESCEND", "sort_target": "KEY", "limit": limit}
        return [_range(f"{self.base}history/", **newest), _range(f"{self.base}ended/", **newest)]


def _a_release(kv: dict[str, Any]) -> bool:
    """Whether an end record says a release; one that is not leaderd's says nothing."""
    try:
        record = orjson.loads(unb64(kv.get("value", "")))
    except ValueError:
        return False
    reason = record.get("end_reason") if isinstance(record, dict) else None
    return isinstance(reason, str) and reason != EndReason.LOST_BACKEND


def tenures(election: str, answer: Any) -> list[Tenure]:
    """The records of a read_history transaction, newest first, their ends inferred."""
    responses = answer.get("responses", [])
    kvs = [r.get("response_range", {}).get("kvs") or [] for r in responses]
    ended = {_term(kv): orjson.loads(unb64(kv["value"])) for kv in kvs[1]}
    records, newer = [], None
    # A granted term's heir trims the records past the retention at its first renewal.
    oldest = _term(kvs[0][0]) - HISTORY_RETENTION + 1 if kvs[0] else 0
    for kv in kvs[0]:
        term, value = _term(kv), orjson.loads(unb64(kv["value"]))
        if term < oldest:
            break
        acquired = _when(value.get("acquired_at"))
        end = ended.get(term, {})
        reason = end.get("end_reason") or (EndReason.EXPIRED.value if newer else None)
        ended_at = _when(end.get("ended_at")) or (newer if reason else None)
        records.append(Tenure(election, term, value["holder"], value.get("instance", ""),
                              value.get("address", ""), acquired, ended_at, reason))  # fmt: skip
        newer = acquired
    return records


class MemberClock:
    """The members of every election, aged on this daemon's own clock (CLOCK_BOOTTIME)."""

    def __init__(self) -> None:
        # member key -> (its mod revision, when this daemon first saw that revision)
        self._seen: dict[str, tuple[int, float]] = {}

    def members(
        self, kvs: list[dict[str, Any]], me: Candidate | None, keys: Keys
    ) -> tuple[Member, ...]:
        """The members listed by ``kvs``, all of the election ``keys`` names."""
        now, found = boottime(), []
        listed = {unb64(kv["key"]).decode(errors="replace") for kv in kvs}
        for gone in [k for k in self._seen if k.startswith(keys.members) and k not in listed]:
            del self._seen[gone]  # pruned, or deleted by hand: forget it
        for kv in kvs:
            key, revision = unb64(kv["key"]).decode(errors="replace"), int(kv["mod_revision"])
            seen = self._seen.get(key)
            if seen is None or seen[0] != revision:
                seen = self._seen[key] = (revision, now)
            try:
                v = orjson.loads(unb64(kv["value"]))
                member = Member(v["node_id"], v["instance"], v.get("address", ""),
                                v.get("version", ""), float(v["ttl"]), _when(v.get("heard_at")),
                                0.0 if _is(v, me) else now - seen[1],
                                bool(v.get("campaigning", False)), int(v.get("priority", 1)),
                                str(v.get("health", "")), str(v.get("switchover", "")))  # fmt: skip
            except (ValueError, KeyError, TypeError):
                continue  # not a leaderd member: ignore it
            found.append(member)
        return tuple(found)

    def saw(self, key: str, revision: int) -> None:
        """A watch event put the member key ``key`` at ``revision``."""
        seen = self._seen.get(key)
        if seen is None or seen[0] < revision:
            self._seen[key] = (revision, boottime())

    def age(self, key: str) -> float | None:
        """Seconds since this daemon saw the member key at ``key`` change; None: never seen."""
        seen = self._seen.get(key)
        return None if seen is None else boottime() - seen[1]

    def silent(self, members: tuple[Member, ...], keys: Keys) -> list[tuple[str, int]]:
        """(key, mod revision) of the members to prune: silent for PRUNE_AFTER_TTLS ttls."""
        return [
            (key, self._seen[key][0])
            for m in members
            if m.heard_ago >= PRUNE_AFTER_TTLS * m.ttl
            and (key := f"{keys.members}{m.node_id}/{m.instance}") in self._seen
        ]


def _is(value: dict[str, Any], me: Candidate | None) -> bool:
    return me is not None and (value["node_id"], value["instance"]) == (me.node_id, me.instance)


def _term(kv: dict[str, Any]) -> int:
    return int(unb64(kv["key"]).decode().rsplit("/", 1)[1])


def _when(text: str | None) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text) if text else None
    except ValueError:
        return None
