"""What the etcd backend knows of an election, and the helpers that read etcd's answers.

``<prefix><election>/leader``: the holder, as JSON, under the holder's lease.
``<prefix><election>/term``: the last term begun; no lease, never deleted.
``<prefix><election>/reserved``: a hand-over's reservation, the node id that alone may
acquire the free lease, under a lease of one ttl (its end is etcd's lessor's).
The spare (an etcd lease with no key yet) is spare.py's (docs/etcd.md).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

import orjson

from ...clock import boottime
from ..base import Candidate
from .gateway import unb64

log = logging.getLogger("leaderd.backends.etcd")

SLOW = 0.9  # the slowest rate a clock may run at against another's (clock_drift < 0.1)
# A spare with < FRESH ttl left is kept alive with the transaction; < TEND, by a round.
FRESH, TEND = 0.75, 0.8


@dataclass(frozen=True)
class Holder:
    """The leader key: its JSON value, and what etcd says of it."""

    node_id: str
    address: str
    instance: str
    term: int
    acquired_at: str  # ISO 8601, the acquiring host's wall clock: for display only
    lease: int  # the etcd lease the key is attached to
    # The key's mod revision: names this holder's tenure (not the create revision, which a
    # grant's put keeps from the holder before).
    modified: int


@dataclass(frozen=True)
class Reservation:
    """The reserved key: for whom, its create revision (0: absent) and its lease."""

    node_id: str = ""
    created: int = 0
    lease: int = 0


NO_RESERVATION = Reservation()


@dataclass(frozen=True)
class State:
    """One election as etcd showed it at ``revision``."""

    revision: int
    holder: Holder | None
    term: int
    term_modified: int  # the term key's mod revision, 0 while it does not exist
    reserved: Reservation = NO_RESERVATION  # a hand-over's, while its lease lasts

    def reserved_against(self, node_id: str) -> bool:
        return self.holder is None and self.reserved.node_id not in ("", node_id)


@dataclass(frozen=True)
class Spare:
    """An etcd lease with no key, for the next acquisition (or a release's grant)."""

    id: int
    ttl: int  # its ttl in etcd: whole seconds, at least etcd's minimum
    kept_at: float  # CLOCK_BOOTTIME when its creation or last keepalive was SENT: it ages on it
    # The heard_at of the round that sent that creation or keepalive (after the engine's send
    # time for the round): a release's grant of this lease counts from it. None: unknown.
    kept_in: dt.datetime | None = None

    def left(self) -> float:
        """Seconds it surely has left: its age counts as age / 0.9, so that whatever the
        clocks' rates (drift < 10%), it never outlasts what etcd's lessor gives it."""
        return self.ttl - (boottime() - self.kept_at) / SLOW

    def fresh(self, ttl: float) -> bool:
        """3/4 of a ttl left: the new leader's first deadline comes well after its first renewal."""
        return self.left() >= FRESH * ttl


@dataclass(frozen=True)
class Round:
    """One request of the etcd backend in a round: who asks, for how long, and until when
    (in which election: the ``EtcdElection`` it is sent with)."""

    me: Candidate
    ttl: float
    min_term: int
    give_up: float  # on CLOCK_BOOTTIME: it bounds this request only
    lost_term: int = 0
    campaigning: bool = True  # an observe's heartbeat is not: it withdraws any candidacy
    heard_at: str = ""  # names this round's heartbeat, never another's (grant.py)

    def left(self) -> float:
        return self.give_up - boottime()


def kept_in(ask: Round) -> dt.datetime:
    """The round an etcd lease created or kept alive now is part of, as its heartbeat names it."""
    return dt.datetime.fromisoformat(ask.heard_at)


def mine(state: State, me: Candidate) -> bool:
    holder = state.holder
    return holder is not None and (holder.node_id, holder.instance) == (me.node_id, me.instance)


def theirs(state: State, me: Candidate) -> bool:
    return state.holder is not None and not mine(state, me)


def named(holder: Holder) -> tuple[str, str, int]:
    return holder.node_id, holder.instance, holder.term


def state_of(answer: Any) -> State:
    """The leader, term and reserved keys' ranges of a transaction (missing ones read as
    absent)."""
    kvs: list[dict[str, Any]] = [
        (r.get("response_range", {}).get("kvs") or [{}])[0] for r in answer.get("responses", [])
    ]
    leader, term, reserved = [*kvs, {}, {}, {}][:3]
    holder = holder_of(leader) if leader else None
    stored = term_of(term)
    held, modified = holder.term if holder else 0, int_of(term.get("mod_revision"))
    return State(revision_of(answer), holder, max(stored, held), modified, reservation(reserved))


def compare(key: str, target: str, revision: int) -> dict[str, Any]:
    field = "create_revision" if target == "CREATE" else "mod_revision"
    return {"key": key, "target": target, "result": "EQUAL", field: revision}


def holder_of(kv: dict[str, Any]) -> Holder:
    try:
        value = orjson.loads(unb64(kv.get("value", "")))
        node_id, term = str(value["node_id"]), int(value["term"])
        address, instance = str(value.get("address", "")), str(value.get("instance", ""))
        acquired_at = str(value.get("acquired_at", ""))
    except (ValueError, KeyError, TypeError):
        key = unb64(kv.get("key", "")).decode(errors="replace")
        log.warning("etcd key %s does not hold a leaderd lease", key)
        node_id, term, address, instance, acquired_at = "<not leaderd>", 0, "", "", ""
    return Holder(node_id, address, instance, term, acquired_at, int_of(kv.get("lease")),
                  int_of(kv.get("mod_revision")))  # fmt: skip


def reservation(kv: dict[str, Any] | None) -> Reservation:
    """The reserved key's value is the node id itself."""
    if not kv:
        return Reservation()
    node_id = unb64(kv.get("value", "")).decode(errors="replace")
    return Reservation(node_id, int_of(kv.get("create_revision")), int_of(kv.get("lease")))


def term_of(kv: dict[str, Any]) -> int:
    """The term key's value is the term in decimal."""
    return int_of(unb64(kv.get("value", "")).decode(errors="replace"))


def when(text: str) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        return None


def revision_of(answer: Any) -> int:
    return int_of(answer.get("header", {}).get("revision"))


def int_of(value: Any) -> int:
    """etcd's 64-bit integers come as strings; absent (a default) or unreadable is 0."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
