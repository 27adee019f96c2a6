"""What leaderd keeps in etcd for one election, as etcd's JSON gateway shows it (docs/etcd.md).

``<prefix><election>/leader``: the holder, as JSON, under the holder's lease.
``<prefix><election>/term``: the last term granted; no lease, never deleted.
``<prefix><election>/reserved``: a hand-over's reservation, the node id that alone may
acquire the free lease, under a lease of one ttl (its end is etcd's lessor's).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

import orjson

from .etcd_gateway import unb64

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Holder:
    """The leader key: its JSON value, and what etcd says of it."""

    node_id: str
    address: str
    instance: str
    term: int
    acquired_at: str  # ISO 8601, the acquiring host's wall clock: for display only
    lease: int  # the etcd lease the key is attached to
    created: int  # the key's create revision: names this holder's tenure


@dataclass(frozen=True)
class Reservation:
    """The reserved key: for whom, its create revision (0: absent) and its lease."""

    node_id: str = ""
    created: int = 0
    lease: int = 0


NO_RESERVATION = Reservation()


def holder(kv: dict[str, Any]) -> Holder:
    try:
        value = orjson.loads(unb64(kv.get("value", "")))
        node_id, term = str(value["node_id"]), int(value["term"])
        address, instance = str(value.get("address", "")), str(value.get("instance", ""))
        acquired_at = str(value.get("acquired_at", ""))
    except (ValueError, KeyError, TypeError):
        key = unb64(kv.get("key", "")).decode(errors="replace")
        log.warning("etcd key %s does not hold a leaderd lease", key)
        node_id, term, address, instance, acquired_at = "<not leaderd>", 0, "", "", ""
    return Holder(node_id, address, instance, term, acquired_at, to_int(kv.get("lease")),
                  to_int(kv.get("create_revision")))  # fmt: skip


def reservation(kv: dict[str, Any] | None) -> Reservation:
    """The reserved key's value is the node id itself."""
    if not kv:
        return Reservation()
    node_id = unb64(kv.get("value", "")).decode(errors="replace")
    return Reservation(node_id, to_int(kv.get("create_revision")), to_int(kv.get("lease")))


def compare(key: str, target: str, revision: int) -> dict[str, Any]:
    field = "create_revision" if target == "CREATE" else "mod_revision"
    return {"key": key, "target": target, "result": "EQUAL", field: revision}


def when(text: str) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        return None


def revision_of(answer: Any) -> int:
    return to_int(answer.get("header", {}).get("revision"))


def to_int(value: Any) -> int:
    """etcd's 64-bit integers come as strings; absent (a default) or unreadable is 0."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
