"""A model of etcd as the etcd backend uses it, through the JSON gateway's shapes: a
revisioned key space with transactions (compare on mod or create revision), leases with
keepalives and time-to-live judged on the server's clock, and watch streams that resume
from a revision.

A lease expires exactly at its deadline (no sweep delay: deleting a key as early as etcd
may is the adversarial choice), deleting its keys in one revision, which watchers see.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from leaderd.backends.etcd.errors import EtcdError

from .network import SERVER
from .vloop import VirtualLoop

_NOT_FOUND = 5  # gRPC NOT_FOUND: "etcdserver: requested lease not found"

Event = tuple[str, str, "dict[str, Any] | None", int]  # (type, key, kv, revision)


def text(b64: str) -> str:
    return base64.b64decode(b64).decode()


def b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


@dataclass
class Kv:
    value: str  # base64, as the gateway carries it
    create: int
    mod: int
    version: int
    lease: int

    def wire(self, key: str) -> dict[str, Any]:
        return {"key": b64(key), "value": self.value, "create_revision": str(self.create),
                "mod_revision": str(self.mod), "version": str(self.version),
                "lease": str(self.lease)}  # fmt: skip


@dataclass
class Lease:
    ttl: int
    expires_at: float  # server clock
    keys: set[str] = field(default_factory=set)


@dataclass
class Watcher:
    """One watch stream: the events from ``start`` on, pushed to ``push`` in order."""

    prefix: str
    end: str
    push: Callable[[dict[str, Any] | None], None]


class EtcdServer:
    """One etcd cluster, as one linearizable key space on a clock at ``rate``."""

    def __init__(self, loop: VirtualLoop, rate: float, tell: Callable[[str], None]) -> None:
        self.loop, self.rate, self.tell = loop, rate, tell
        self.kvs: dict[str, Kv] = {}
        self.leases: dict[int, Lease] = {}
        self.revision = 1
        self.history: list[Event] = []
        self.watchers: list[Watcher] = []
        self._next_lease = 0x1000

    def now(self) -> float:
        return self.rate * self.loop.time()

    def handle(self, path: str, body: dict[str, Any]) -> Any:
        """One request, applied atomically; its answer as the gateway would give it."""
        self.expire()
        if path == "/v3/kv/txn":
            return self.txn(body)
        if path == "/v3/kv/range":
            return self._header({**self._range(body)})
        if path == "/v3/lease/grant":
            return self._header(self.grant(int(body["TTL"])))
        if path == "/v3/lease/keepalive":
            return {"result": self._header(self.keepalive(int(body["ID"])))}
        if path == "/v3/kv/lease/timetolive":
            return self._header(self.timetolive(int(body["ID"])))
        raise EtcdError(f"model etcd: no {path}", 12)

    # ---- leases ----

    def grant(self, ttl: int) -> dict[str, Any]:
        self._next_lease += 1
        self.leases[self._next_lease] = Lease(ttl, self.now() + ttl)
        self._expire_at(self._next_lease)
        return {"ID": str(self._next_lease), "TTL": str(ttl)}

    def keepalive(self, lease_id: int) -> dict[str, Any]:
        lease = self.leases.get(lease_id)
        if lease is None:
            return {"ID": str(lease_id)}  # the gateway's answer for a lease gone: no TTL
        lease.expires_at = self.now() + lease.ttl
        self._expire_at(lease_id)
        return {"ID": str(lease_id), "TTL": str(lease.ttl)}

    def timetolive(self, lease_id: int) -> dict[str, Any]:
        lease = self.leases.get(lease_id)
        if lease is None:
            return {"ID": str(lease_id), "TTL": "-1"}
        left = int(lease.expires_at - self.now())  # etcd truncates to whole seconds
        return {"ID": str(lease_id), "TTL": str(left), "grantedTTL": str(lease.ttl)}

    def lease_left(self, lease_id: int) -> float:
        lease = self.leases.get(lease_id)
        return -1.0 if lease is None else lease.expires_at - self.now()

    def expire(self) -> None:
        """The lessor: every lease past its deadline goes, with its keys, one revision each."""
        now = self.now()
        for lease_id, lease in sorted(self.leases.items()):
            if lease.expires_at <= now:
                del self.leases[lease_id]
                self.tell(f"etcd: lease {lease_id:x} expired")
                if lease.keys:
                    rev = self.revision + 1
                    events = [e for key in sorted(lease.keys) for e in self._write(key, None, rev)]
                    self._commit(rev, events)

    def _expire_at(self, lease_id: int) -> None:
        delay = max(0.0, (self.leases[lease_id].expires_at - self.now()) / self.rate)
        self.loop.call_later(delay, self.expire, context=SERVER)

    # ---- transactions ----

    def txn(self, body: dict[str, Any]) -> dict[str, Any]:
        succeeded = all(self._holds(c) for c in body.get("compare", []))
        ops = body.get("success" if succeeded else "failure", [])
        for op in ops:  # a put under a lease that is gone fails the whole transaction
            put = op.get("request_put")
            lease = int(put.get("lease", 0) or 0) if put else 0
            if lease and lease not in self.leases:
                raise EtcdError("model etcd: etcdserver: requested lease not found", _NOT_FOUND)
        writes = any("request_range" not in op for op in ops)
        rev = self.revision + 1 if writes else self.revision
        responses, events = [], []
        for op in ops:  # in order: a range sees the puts before it, as in etcd
            if "request_range" in op:
                responses.append({"response_range": self._range(op["request_range"])})
            elif "request_put" in op:
                put = op["request_put"]
                events += self._write(text(put["key"]), put, rev)
                responses.append({"response_put": {}})
            else:
                gone = [k for k in self._keys(op["request_delete_range"]) if k in self.kvs]
                for key in gone:
                    events += self._write(key, None, rev)
                responses.append({"response_delete_range": {"deleted": str(len(gone))}})
        if writes:
            self._commit(rev, events)
        return self._header({"succeeded": succeeded, "responses": responses})

    def _holds(self, compare: dict[str, Any]) -> bool:
        kv = self.kvs.get(text(compare["key"]))
        target = compare["target"]
        if target == "CREATE":
            have, want = (kv.create if kv else 0), int(compare.get("create_revision", 0))
        else:
            have, want = (kv.mod if kv else 0), int(compare.get("mod_revision", 0))
        assert compare.get("result", "EQUAL") == "EQUAL"
        return have == want

    def _write(self, key: str, put: dict[str, Any] | None, rev: int) -> list[Event]:
        """One put (or, ``put`` None, delete) at revision ``rev``; its event."""
        old = self.kvs.get(key)
        if old is not None and old.lease in self.leases:
            self.leases[old.lease].keys.discard(key)
        if put is None:
            if old is None:
                return []
            del self.kvs[key]
            if key.endswith("/leader"):
                self.tell(f"etcd: leader key deleted at {rev}")
            return [("DELETE", key, {"key": b64(key), "mod_revision": str(rev)}, rev)]
        lease = int(put.get("lease", 0) or 0)
        create, version = (old.create, old.version + 1) if old else (rev, 1)
        self.kvs[key] = kv = Kv(put.get("value", ""), create, rev, version, lease)
        if lease:
            self.leases[lease].keys.add(key)
        if key.endswith("/leader"):
            self.tell(f"etcd: leader key put at {rev} under lease {lease:x}: {text(kv.value)}")
        return [("PUT", key, kv.wire(key), rev)]

    def _commit(self, rev: int, events: list[Event]) -> None:
        """Revision ``rev`` is done; its events go to every watcher that matches."""
        self.revision = rev
        self.history += events
        for watcher in self.watchers:
            self._send(watcher, [e for e in events if watcher.prefix <= e[1] < watcher.end], rev)

    # ---- reads and watches ----

    def _keys(self, rng: dict[str, Any]) -> list[str]:
        key = text(rng["key"])
        end = text(rng["range_end"]) if rng.get("range_end") else ""
        if not end:
            return [key]
        return sorted(k for k in self.kvs if key <= k < end)

    def _range(self, rng: dict[str, Any]) -> dict[str, Any]:
        found = [k for k in self._keys(rng) if k in self.kvs]
        if rng.get("count_only"):
            return {"count": str(len(found))}
        if rng.get("sort_order") == "DESCEND":
            found.reverse()
        limit = int(rng.get("limit", 0) or 0) or math.inf
        kvs = [self.kvs[k].wire(k) for k in found[: int(min(limit, len(found)))]]
        return {"kvs": kvs, "count": str(len(found))}

    def watch(
        self, request: dict[str, Any], push: Callable[[dict[str, Any] | None], None]
    ) -> Watcher:
        """A new stream: "created", then the events since ``start_revision`` (if any)."""
        watcher = Watcher(text(request["key"]), text(request["range_end"]), push)
        push({"result": self._header({"created": True})})
        start = int(request.get("start_revision", 0) or 0)
        if start:
            missed = [e for e in self.history if e[3] >= start
                      and watcher.prefix <= e[1] < watcher.end]  # fmt: skip
            for rev in sorted({e[3] for e in missed}):
                self._send(watcher, [e for e in missed if e[3] == rev], rev)
        self.watchers.append(watcher)
        return watcher

    def _send(self, watcher: Watcher, events: list[Event], revision: int) -> None:
        if events:
            wire = [{"type": t, "kv": kv} for t, _, kv, _ in events]
            watcher.push({"result": {"header": {"revision": str(revision)}, "events": wire}})

    def _header(self, answer: dict[str, Any]) -> dict[str, Any]:
        return {"header": {"revision": str(self.revision)}, **answer}
