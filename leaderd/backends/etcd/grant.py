"""The one-write hand-over on etcd (docs/algorithm.md, "One-write hand-over"; docs/etcd.md).

A campaigning standby offers its spare lease in a candidate key (records.Keys). A
release that grants puts the leader key under the freshest candidate's spare lease, with
the next term, in the transaction that ends its own term, on two conditions: its own key
is unchanged since its tenure began (its mod revision: a grant's put keeps the key's
create revision, so only the mod revision names one tenure), and the candidate key is
unchanged since it read it (a standby that stopped campaigning deleted it). A spare that
is gone fails the transaction in etcd ("lease not found"): the release then frees the lease
as before.

The granted lease expires when etcd's lessor says, counting from the spare's last
keepalive; the standby sent that keepalive after the engine's send time of the round named
by ``Spare.kept_in``, so self-fencing from that round's send time is safe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ..asks import Heir
from ..base import Candidate
from .gateway import b64, unb64
from .records import Keys
from .state import Holder, compare, int_of


@dataclass(frozen=True)
class Candidacy:
    """A candidate key: who offers which spare lease, as of the key's mod revision."""

    node_id: str
    instance: str
    address: str
    lease: int
    modified: int
    priority: int = 1  # a grant prefers the highest; 0 is never granted
    ttl: float = 0.0  # the candidate's own; 0: not in the key (a daemon of an older version)


def candidacy(kv: dict[str, Any]) -> Candidacy | None:
    """A candidate key's record; None if it is not a leaderd candidate's."""
    try:
        v = orjson.loads(unb64(kv["value"]))
        return Candidacy(str(v["node_id"]), str(v["instance"]), str(v.get("address", "")),
                         int(v["lease"]), int_of(kv.get("mod_revision")),
                         int(v.get("priority", 1)), float(v.get("ttl", 0)))  # fmt: skip
    except (ValueError, KeyError, TypeError):
        return None


class Offers:
    """The candidacies of one election, by (node id, instance), as the newest of a read or
    a watch event showed them: a leader knows the offers of the moment it releases."""

    def __init__(self) -> None:
        self.known: dict[tuple[str, str], Candidacy] = {}
        self._as_of = 0  # the revision they are known at

    def read(self, keys: Keys, answer: Any, revision: int) -> None:
        """The candidate keys a transaction's ranges returned, at ``revision``."""
        if revision < self._as_of:
            return  # a watch event already told of something newer
        found = {}
        for response in answer.get("responses", []):
            for kv in response.get("response_range", {}).get("kvs") or []:
                key = unb64(kv.get("key", "")).decode(errors="replace")
                if key.startswith(keys.candidates) and (offer := candidacy(kv)) is not None:
                    found[(offer.node_id, offer.instance)] = offer
        self.known, self._as_of = found, revision

    def event(self, keys: Keys, key: str, kv: dict[str, Any] | None, revision: int) -> None:
        """A watch event on the candidate key ``key`` (kv None: deleted)."""
        if revision <= self._as_of:
            return
        self._as_of = revision
        if kv is None:
            for who, offer in list(self.known.items()):
                if keys.candidate(offer.node_id, offer.instance) == key:
                    del self.known[who]
        elif (put := candidacy(kv)) is not None:
            self.known[(put.node_id, put.instance)] = put

    def drop(self, node_id: str, instance: str) -> None:
        self.known.pop((node_id, instance), None)


def freshest_heir(
    offers: dict[tuple[str, str], Candidacy],
    heir: Heir,
    age: Callable[[Candidacy], float | None],
    ttl: Callable[[Candidacy], float | None],
) -> Candidacy | None:
    """Of the candidates ``heir`` allows (their member record changed less than the member's
    own ``ttl`` times its window ago on this daemon's clock, ``age``), the one of the highest
    priority, and of those the one whose record changed most recently; ties by node id and
    instance, as the SQL backends order them (docs/algorithm.md, "Who leads")."""
    live = [
        (-offer.priority, seen, offer.node_id, offer.instance, offer)
        for offer in offers.values()
        if (seen := age(offer)) is not None
        and (own := ttl(offer)) is not None
        and heir.may_inherit(offer.node_id, seen, own, offer.priority)
    ]
    return min(live, key=lambda found: found[:4])[4] if live else None


def grant_txn(
    keys: Keys, holder: Holder, offer: Candidacy, term: int, acquired_at: str, reason: str
) -> dict[str, Any]:
    """The transaction of a grant: while our key is unchanged since our tenure began and the offer
    is unchanged since it was read, put the key under the offer's spare lease with ``term``,
    move the term counter, drop the candidate key, and record our end and the heir's start
    (the heir's first renewal trims the history: records.Keys.trimmed)."""
    offered = b64(keys.candidate(offer.node_id, offer.instance))
    value = {"node_id": offer.node_id, "address": offer.address, "instance": offer.instance,
             "term": term, "acquired_at": acquired_at}  # fmt: skip
    heir = Candidate(offer.node_id, offer.address, offer.instance)
    return {
        "compare": [compare(b64(keys.leader), "MOD", holder.modified),
                    compare(offered, "MOD", offer.modified)],
        "success": [
            {"request_put": {"key": b64(keys.leader), "value": b64(orjson.dumps(value)),
                             "lease": offer.lease}},
            {"request_put": {"key": b64(keys.term), "value": b64(str(term))}},
            {"request_delete_range": {"key": offered}},
            keys.released(holder.term, reason),
            keys.began(heir, term, acquired_at),
        ],
    }  # fmt: skip
