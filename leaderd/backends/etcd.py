"""etcd:// and etcd+https:// — one key per election under an etcd lease; etcd's lessor
judges expiry and deletes the key when the lease runs out. See docs/etcd.md.

Keys: ``<prefix><election>/leader`` holds the holder as JSON, attached to the holder's
lease; ``<prefix><election>/term`` holds the last term granted, has no lease and is never
deleted, so terms survive release, daemon restarts and etcd restarts.

* Acquire is ONE transaction: if the leader key is absent and the term key is as last read,
  put both (the leader key under a lease of ``ttl`` seconds, the term + 1).
* Renew keeps that lease alive and reads the key at the same time: it counts only if the key
  still exists under that lease with the create revision this holder's acquisition made.
* Release deletes the key only if its create revision is the holder's own: a stale holder
  can never delete its successor's key.
* An expired key is gone, so etcd reports the election free and a standby acquires at once.
  The lessor runs on the etcd leader's monotonic clock, which no wall-clock step moves, and a
  present key is never taken over: ``takeover`` is not needed (DESIGN §1.3, docs/etcd.md).
* Standbys wake on an etcd watch of the prefix (etcd_watch.py) and keep a lease granted in
  advance (a spare, kept alive by their rounds, also the lease a release leaves): a graceful
  handover is one watch event and one transaction, sent with the spare's keepalive.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from .base import Backend, BackendError, BackendUnavailable, Candidate, Lease
from .etcd_gateway import EtcdClient, EtcdError, EtcdSettings, b64, prefix_end, unb64
from .etcd_watch import PrefixWatch

log = logging.getLogger(__name__)

_DEFAULT_TIMEOUT = 5.0  # observe and release have no timeout argument
_LEASE_NOT_FOUND = 5  # gRPC NOT_FOUND: "etcdserver: requested lease not found"


@dataclass(frozen=True)
class _Holder:
    """The leader key: its JSON value, and what etcd says of it."""

    node_id: str
    address: str
    instance: str
    term: int
    acquired_at: str  # ISO 8601, the acquiring host's wall clock: for display only
    lease: int  # the etcd lease the key is attached to
    created: int  # the key's create revision: names this holder's tenure
    modified: int


@dataclass(frozen=True)
class _State:
    """One election as etcd showed it at ``revision``."""

    revision: int
    holder: _Holder | None
    term: int
    term_modified: int  # the term key's mod revision, 0 while it does not exist


@dataclass(frozen=True)
class _Spare:
    """A granted lease with no key, for the next acquisition."""

    id: int
    ttl: int
    kept_at: float  # time.monotonic() when its grant or last keepalive was sent

    def wilting(self) -> bool:
        """Half its ttl is gone: keep it alive in the next round."""
        return time.monotonic() - self.kept_at > self.ttl / 2


class EtcdBackend(Backend):
    kind = "etcd"

    def __init__(self, settings: EtcdSettings) -> None:
        self._settings = settings
        self._etcd = EtcdClient(settings)
        self._prefix = settings.prefix
        self._states: dict[str, _State] = {}
        self._answered: dict[str, int] = {}  # revision of the last answer, by election
        self._spares: dict[str, _Spare] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._watch = PrefixWatch(self._etcd, self._prefix, self._on_event)

    @classmethod
    def from_url(cls, url: str) -> EtcdBackend:
        return cls(EtcdSettings.from_url(url))

    @property
    def description(self) -> str:
        return self._settings.description

    @property
    def watching(self) -> bool:
        """True while the watch stream is up (else standbys poll)."""
        return self._watch.watching

    async def open(self, elections: Sequence[str]) -> None:
        """Check that etcd answers (TLS, credentials); start the watch either way."""
        self._watch.start()
        body = {"key": b64(self._prefix), "range_end": prefix_end(self._prefix), "count_only": True}
        await self._call("/v3/kv/range", body, _DEFAULT_TIMEOUT, "reading the elections")

    async def observe(self, election: str) -> Lease:
        state = await self._read(election, _DEFAULT_TIMEOUT)
        if state.holder is None:
            return self._answer(election, state, None)
        body = {"ID": state.holder.lease}
        lease = await self._call("/v3/kv/lease/timetolive", body, _DEFAULT_TIMEOUT, "reading it")
        return self._answer(election, state, max(0.0, float(lease.get("TTL", -1))))  # -1: gone

    async def acquire_or_renew(
        self,
        election: str,
        candidate: Candidate,
        ttl: float,
        timeout: float,
        wait: float = 0.0,
        *,
        takeover: str = "",
        min_term: int = 0,
    ) -> Lease:
        since = time.monotonic()
        give_up = since + timeout
        state, fresh = self._states.get(election), False
        for _ in range(3):
            # Another holder (or nothing known) is always read again; a key a watch event said
            # was freed, or our own, go straight to their transaction or keepalive.
            if state is None or not (fresh or state.holder is None or _mine(state, candidate)):
                state = await self._look(election, ttl, give_up)
            if state.holder is None:
                state, lease = await self._acquire(
                    election, candidate, ttl, state, min_term, since, give_up
                )
            elif _mine(state, candidate):
                state, lease = await self._renew(election, state, ttl, give_up)
            else:
                return self._answer(election, state, None)
            if lease is not None:
                return lease
            fresh = True  # each path ends with what etcd has just said
        raise BackendUnavailable(f"acquiring election {election}: lost three races")

    async def release(self, election: str, candidate: Candidate, term: int) -> None:
        state = self._states.get(election)
        if state is None or not _mine(state, candidate):
            state = await self._read(election, _DEFAULT_TIMEOUT)
        holder = state.holder
        if holder is None or not _mine(state, candidate) or holder.term != term:
            return
        key = b64(self._key(election))
        body = {
            "compare": [_compare(key, "CREATE", holder.created)],
            "success": [{"request_delete_range": {"key": key}}],
        }
        answer = await self._call("/v3/kv/txn", body, _DEFAULT_TIMEOUT, "releasing the lease")
        if answer.get("succeeded"):
            self._remember(election, replace(state, revision=_revision(answer), holder=None))
            # The lease outlives its key: it is the spare of this node's next acquisition.
            self._keep_spare(election, _Spare(holder.lease, 0, -math.inf))

    async def wait_for_change(self, election: str, timeout: float) -> None:
        await self._watch.wait(election, self._answered.get(election, 0), timeout)
        # Told once: a wake-up that no successful request follows (etcd down) is not news again.
        self._answered[election] = max(self._answered.get(election, 0), self._watch.heard(election))

    async def close(self) -> None:
        """Spares are not revoked: a revoke would compete with the successor's transaction
        at the moment of a handover, and an unused lease expires by itself within ttl."""
        await self._watch.stop()
        self._spares.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self._tasks), 1.0)
        await self._etcd.close()

    # ---- acquire, renew, and the spare lease ---------------------------------------------

    async def _acquire(
        self,
        election: str,
        me: Candidate,
        ttl: float,
        state: _State,
        min_term: int,
        since: float,
        give_up: float,
    ) -> tuple[_State, Lease | None]:
        """The transaction: take the free key and the next term, or learn who has them."""
        spare = self._spares.pop(election, None)
        if spare is None:
            spare = await self._grant(ttl, give_up)
        term = max(state.term + 1, min_term)
        now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        value = {"node_id": me.node_id, "address": me.address, "instance": me.instance,
                 "term": term, "acquired_at": now}  # fmt: skip
        key, term_key = b64(self._key(election)), b64(self._term_key(election))
        body = {
            "compare": [_compare(key, "CREATE", 0), _compare(term_key, "MOD", state.term_modified)],
            "success": [
                {"request_put": {"key": key, "value": b64(orjson.dumps(value)), "lease": spare.id}},
                {"request_put": {"key": term_key, "value": b64(str(term))}},
            ],
            "failure": [{"request_range": {"key": key}}, {"request_range": {"key": term_key}}],
        }
        try:
            # A spare granted before this request was sent is kept alive with the transaction,
            # so its ttl counts from after the engine's t_send; 0 if it had expired.
            answer, kept = await asyncio.gather(
                self._call("/v3/kv/txn", body, _left(give_up), "acquiring the lease"),
                self._keepalive(spare.id, give_up) if spare.kept_at < since else _ttl(spare),
            )
        except EtcdError as exc:
            if exc.code != _LEASE_NOT_FOUND:
                raise
            return state, None  # the spare had expired: a new one next time round
        if not answer.get("succeeded"):
            self._keep_spare(
                election, replace(spare, ttl=kept or spare.ttl, kept_at=time.monotonic())
            )
            return self._remember(election, self._parse(answer)), None
        revision = _revision(answer)
        holder = _Holder(
            me.node_id, me.address, me.instance, term, now, spare.id, revision, revision
        )
        state = self._remember(election, _State(revision, holder, term, revision))
        return state, self._answer(election, state, float(kept))

    async def _renew(
        self, election: str, state: _State, ttl: float, give_up: float
    ) -> tuple[_State, Lease | None]:
        """Keep our key's lease alive, and check that the key is still ours under it."""
        assert state.holder is not None
        ours = state.holder
        kept, state = await asyncio.gather(
            self._keepalive(ours.lease, give_up), self._read(election, _left(give_up))
        )
        holder = state.holder
        if holder is None or holder.created != ours.created:
            if kept:  # the key went (deleted by hand) but the lease lives: a spare
                self._keep_spare(election, _Spare(ours.lease, kept, time.monotonic()))
            return state, None
        # A lease the lessor found expired is lost even while its key still shows.
        return state, self._answer(election, state, float(kept))

    async def _look(self, election: str, ttl: float, give_up: float) -> _State:
        """A follower's round: read the election, and tend the spare meanwhile."""
        state, _ = await asyncio.gather(
            self._read(election, _left(give_up)), self._tend_spare(election, ttl, give_up)
        )
        return state

    async def _tend_spare(self, election: str, ttl: float, give_up: float) -> None:
        """Have a live spare: grant one, or keep it alive once half its ttl is gone."""
        spare = self._spares.get(election)
        try:
            if spare is None:
                self._keep_spare(election, await self._grant(ttl, give_up))
            elif spare.wilting():
                sent_at = time.monotonic()
                kept = await self._keepalive(spare.id, give_up)
                if self._spares.get(election) is spare:
                    self._spares[election] = replace(spare, ttl=kept, kept_at=sent_at)
                if not kept:
                    del self._spares[election]
        except BackendError:
            return  # the round's own request says what is wrong

    def _keep_spare(self, election: str, spare: _Spare) -> None:
        previous = self._spares.get(election)
        self._spares[election] = spare
        if previous is not None and previous.id != spare.id:
            task = asyncio.get_running_loop().create_task(self._revoke(previous.id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _grant(self, ttl: float, give_up: float) -> _Spare:
        sent_at, body = time.monotonic(), {"TTL": max(1, math.ceil(ttl))}
        answer = await self._call("/v3/lease/grant", body, _left(give_up), "granting a lease")
        return _Spare(int(answer["ID"]), int(answer["TTL"]), sent_at)

    async def _keepalive(self, lease: int, give_up: float) -> int:
        """The lease's ttl from now on; 0 if it has expired."""
        answer = await self._call(
            "/v3/lease/keepalive", {"ID": lease}, _left(give_up), "renewing the lease"
        )
        return int(answer.get("result", {}).get("TTL", 0))

    async def _revoke(self, lease: int) -> None:
        with contextlib.suppress(BackendError):
            await self._call("/v3/lease/revoke", {"ID": lease}, 1.0, "revoking a lease")

    # ---- reading, remembering and answering ----------------------------------------------

    async def _read(self, election: str, timeout: float) -> _State:
        """Both keys of an election, in one read-only transaction (one revision)."""
        keys = (self._key(election), self._term_key(election))
        ranges = [{"request_range": {"key": b64(key)}} for key in keys]
        answer = await self._call("/v3/kv/txn", {"success": ranges}, timeout, "reading the lease")
        return self._remember(election, self._parse(answer))

    def _parse(self, answer: Any) -> _State:
        leader, term = [r.get("response_range", {}).get("kvs", []) for r in answer["responses"]]
        holder = _holder(leader[0]) if leader else None
        stored = int(unb64(term[0].get("value", "")) or 0) if term else 0
        modified = int(term[0].get("mod_revision", 0)) if term else 0
        return _State(
            _revision(answer), holder, max(stored, holder.term if holder else 0), modified
        )

    def _remember(self, election: str, state: _State) -> _State:
        known = self._states.get(election)
        if known is None or state.revision >= known.revision:
            self._states[election] = state
        return state

    def _answer(self, election: str, state: _State, expires_in: float | None) -> Lease:
        self._answered[election] = max(self._answered.get(election, 0), state.revision)
        holder = state.holder
        if holder is None:
            return Lease(election, None, "", state.term, None, None)
        when, version = _when(holder.acquired_at), f"{holder.created}.{holder.modified}"
        return Lease(election, holder.node_id, holder.address, holder.term, when, expires_in,
                     instance=holder.instance, version=version)  # fmt: skip

    def _on_event(self, key: str, kv: dict[str, Any] | None, revision: int) -> str | None:
        """A watch event (kv None: deleted): update what we know; the election it concerns."""
        election, _, what = key[len(self._prefix) :].partition("/")
        if what not in ("leader", "term"):
            return None
        known = self._states.get(election)
        if known is None or revision < known.revision:
            return election
        if what == "leader":
            holder = None if kv is None else _holder(kv)
            self._states[election] = replace(known, revision=revision, holder=holder)
        elif kv is not None:
            term = int(unb64(kv.get("value", "")) or 0)
            self._states[election] = replace(
                known, revision=revision, term=term, term_modified=revision
            )
        return election

    async def _call(self, path: str, body: dict[str, Any], timeout: float, doing: str) -> Any:
        if timeout <= 0:
            raise BackendUnavailable(f"{doing}: no time left")
        return await self._etcd.call(path, body, timeout, doing)

    def _key(self, election: str) -> str:
        return f"{self._prefix}{election}/leader"

    def _term_key(self, election: str) -> str:
        return f"{self._prefix}{election}/term"


def _compare(key: str, target: str, revision: int) -> dict[str, Any]:
    field = "create_revision" if target == "CREATE" else "mod_revision"
    return {"key": key, "target": target, "result": "EQUAL", field: revision}


async def _ttl(spare: _Spare) -> int:
    return spare.ttl


def _holder(kv: dict[str, Any]) -> _Holder:
    try:
        value = orjson.loads(unb64(kv.get("value", "")))
        node_id, term = str(value["node_id"]), int(value["term"])
        address, instance = str(value.get("address", "")), str(value.get("instance", ""))
        acquired_at = str(value.get("acquired_at", ""))
    except (ValueError, KeyError, TypeError):
        key = unb64(kv.get("key", "")).decode(errors="replace")
        log.warning("etcd key %s does not hold a leaderd lease", key)
        node_id, term, address, instance, acquired_at = "<not leaderd>", 0, "", "", ""
    revision = int(kv.get("mod_revision", 0))
    created, lease = int(kv.get("create_revision", revision)), int(kv.get("lease", 0))
    return _Holder(node_id, address, instance, term, acquired_at, lease, created, revision)


def _mine(state: _State, me: Candidate) -> bool:
    holder = state.holder
    return holder is not None and (holder.node_id, holder.instance) == (me.node_id, me.instance)


def _when(text: str) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        return None


def _revision(answer: Any) -> int:
    return int(answer.get("header", {}).get("revision", 0))


def _left(give_up: float) -> float:
    return give_up - time.monotonic()
