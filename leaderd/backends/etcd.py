"""etcd:// and etcd+https:// — one key per election under an etcd lease (docs/etcd.md).

``<prefix><election>/leader`` holds the holder as JSON under the holder's lease;
``<prefix><election>/term`` holds the last term granted: no lease, never deleted.

* Acquire is ONE transaction: if the leader key is absent and the term key is as last read,
  put both (the leader key under a lease of ``ttl`` seconds, the term + 1).
* Renew keeps that lease alive and reads the key at the same time: it counts only if the key
  still exists with the mod revision this holder's tenure began at (its acquisition, or the
  grant that gave it the key: a grant's put keeps the create revision, so only the mod
  revision names one tenure).
* Release deletes the key only if its mod revision is the holder's own: a stale holder
  can never delete its successor's key.
* A holder that hears from the watch that its key was deleted (etcd can revoke a lease that
  is being kept alive: docs/etcd.md, "A lease etcd revokes while it is kept alive") or put
  by another steps down at once: ``wait_for_change`` raises LeaseLost.
* An expired key is gone, so etcd reports the election free and a standby acquires at once.
  The lessor runs on the etcd leader's monotonic clock, which no wall-clock step moves, and a
  present key is never taken over: ``takeover`` is not needed (docs/algorithm.md, docs/etcd.md).
* Standbys wake on an etcd watch of the prefix (etcd_watch.py) and keep a lease granted in
  advance (a spare), which they offer in a candidate key: a graceful release puts the key
  under the freshest candidate's spare with the next term (etcd_grant.py), and that standby
  leads on the watch event alone. A hand-over is one transaction and one watch event.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import orjson

from ..clock import boottime
from .base import Backend, BackendError, BackendUnavailable, Candidate, Grant, Lease, LeaseLost
from .etcd_gateway import EtcdClient, EtcdError, EtcdSettings, b64, prefix_end, unb64
from .etcd_grant import Offers, grant_txn, successor
from .etcd_records import Keys, MemberClock, now, tenures
from .etcd_state import TEND as _TEND
from .etcd_state import Ask, kept_in, reservation
from .etcd_state import Holder as _Holder
from .etcd_state import Spare as _Spare
from .etcd_state import State as _State
from .etcd_state import compare as _compare
from .etcd_state import holder_of as _holder
from .etcd_state import int_of as _int
from .etcd_state import revision_of as _revision
from .etcd_state import when as _when
from .etcd_watch import PrefixWatch
from .records import EndReason, Member, Tenure

log = logging.getLogger(__name__)

_DEFAULT_TIMEOUT = 5.0  # observe and release have no timeout argument
_LEASE_NOT_FOUND = 5  # gRPC NOT_FOUND: "etcdserver: requested lease not found"
_LESSOR_SWEEP = 0.5  # how often etcd's lessor deletes the keys of expired leases


class EtcdBackend(Backend):
    kind = "etcd"

    def __init__(self, settings: EtcdSettings) -> None:
        self._settings = settings
        self._etcd = EtcdClient(settings)
        self._prefix = settings.prefix
        self._states: dict[str, _State] = {}
        self._answered: dict[str, int] = {}  # revision of the last answer, by election
        self._named: dict[str, tuple[str, str, int] | None] = {}  # the holder it named
        self._held: dict[str, int] = {}  # the mod revision of our key, as the last answer said
        # A watch event that woke the engine named another holder since that answer: only
        # the round it wakes skips the read (a cached holder alone may be a lagging event).
        self._news: set[str] = set()
        self._answers = itertools.count(1)
        self._spares: dict[str, _Spare] = {}  # never revoked: an unused lease ends by itself
        self._watch = PrefixWatch(self._etcd, self._prefix, self._on_event)
        self._members: dict[str, tuple[Member, ...]] = {}  # as the last answer listed them
        self._member_clock = MemberClock()
        self._last_heard_at = dt.datetime.min.replace(tzinfo=dt.UTC)
        self._me: dict[str, Candidate] = {}  # who asks, by election: whom a grant is for
        self._offers = Offers()

    @property
    def grants(self) -> bool:
        return True

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

    async def observe(
        self, election: str, candidate: Candidate | None = None, ttl: float = 0.0
    ) -> Lease:
        give_up = boottime() + _DEFAULT_TIMEOUT
        ask = None
        if candidate is not None:
            ask = Ask(election, candidate, ttl, 0, give_up, 0, False, self._heard_at())
        state = await self._read(election, _DEFAULT_TIMEOUT, ask)
        answer = await self._observed(election, state)
        return answer if ask is None else replace(answer, heartbeat=kept_in(ask))

    async def _observed(self, election: str, state: _State) -> Lease:
        """The answer of an observe: a held lease with what its lessor says is left."""
        if state.holder is None:
            return await self._reserved_answer(election, state, _DEFAULT_TIMEOUT)
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
        lost_term: int = 0,
    ) -> Lease:
        give_up = boottime() + timeout
        ask = Ask(election, candidate, ttl, min_term, give_up, lost_term, True, self._heard_at())
        self._me[election] = candidate
        state = self._states.get(election)
        news = election in self._news and not lost_term  # a lost term is recorded by a read
        if news and state is not None and _theirs(state, candidate):
            # etcd committed what the watch event says: name that holder now, without a
            # request (cached: it leads no one); the next round reads and heartbeats as usual.
            return replace(self._answer(election, state, None), cached=True)
        # Every path below wrote this round's heartbeat: the answer names it, and no other.
        return replace(await self._campaign(ask, state), heartbeat=kept_in(ask))

    async def _campaign(self, ask: Ask, state: _State | None) -> Lease:
        """Read, acquire or renew, until etcd's answer says which (three races at most)."""
        election, candidate, fresh = ask.election, ask.me, False
        for _ in range(3):
            # Another holder (or nothing known) is always read again; a key a watch event said
            # was freed, or our own, go straight to their transaction or keepalive.
            if state is None or not (fresh or state.holder is None or _mine(state, candidate)):
                state = await self._look(ask)
            if state.reserved_against(candidate.node_id):
                return await self._reserved_answer(election, await self._look(ask), ask.left())
            if state.holder is None:
                state, lease = await self._acquire(ask, state)
            elif _mine(state, candidate):
                state, lease = await self._renew(ask, state)
            else:
                return self._answer(election, state, None)
            if lease is not None:
                return lease
            fresh = True  # each path ends with what etcd has just said
        raise BackendUnavailable(f"acquiring election {election}: lost three races")

    async def release(
        self,
        election: str,
        candidate: Candidate,
        term: int,
        reason: EndReason = EndReason.RELEASED,
        *,
        reserve_for: str = "",
        ttl: float = 0.0,
        grant: bool = False,
        version: str = "",
    ) -> None:
        # ``version`` is not compared: a keepalive does not move the key's mod revision, so
        # no revision tells a renewal apart; the engine never leads on a term whose release
        # is in doubt (docs/etcd.md, "A release that lands late").
        state = self._states.get(election)
        if state is None or not _mine(state, candidate):
            state = await self._read(election, _DEFAULT_TIMEOUT)
        holder = state.holder
        if holder is None or not _mine(state, candidate) or holder.term != term:
            return
        if grant and not reserve_for and await self._grant_successor(election, state, reason, ttl):
            return
        key = b64(self._key(election))
        success: list[dict[str, Any]] = [
            {"request_delete_range": {"key": key}},
            self._keys(election).released(term, reason),
        ]
        if reserve_for:  # the reserved key lives under a lease of its own: one ttl
            granted = await self._grant_lease(ttl, _DEFAULT_TIMEOUT)
            reserved = {"key": b64(self._reserved_key(election)), "value": b64(reserve_for)}
            success.append({"request_put": {**reserved, "lease": granted[0]}})
        body = {"compare": [_compare(key, "MOD", holder.modified)], "success": success}
        answer = await self._call("/v3/kv/txn", body, _DEFAULT_TIMEOUT, "releasing the lease")
        if answer.get("succeeded"):
            self._remember(election, replace(state, revision=_revision(answer), holder=None))
            self._held.pop(election, None)
            # The lease outlives its key: it is the spare of this node's next acquisition.
            self._spares[election] = _Spare(holder.lease, 1, -math.inf)  # ttl: a keepalive says

    async def history(self, election: str, limit: int) -> list[Tenure]:
        body = {"success": self._keys(election).read_history(limit)}
        return tenures(election, await self._call("/v3/kv/txn", body, _DEFAULT_TIMEOUT, "reading"))

    async def wait_for_change(self, election: str, timeout: float) -> Grant | None:
        await self._watch.wait(election, self._answered.get(election, 0), timeout)
        # Told once: a wake-up that no successful request follows (etcd down) is not news again.
        self._answered[election] = max(self._answered.get(election, 0), self._watch.heard(election))
        self._check_held(election)
        grant = self._granted(election)
        if grant is None:
            self._note_news(election)
        return grant

    async def close(self) -> None:
        # Spares are left to expire: a revoke now would compete with a successor's transaction.
        await self._watch.stop()
        self._spares.clear()
        await self._etcd.close()

    # ---- the one-write hand-over (etcd_grant.py) --------------------------------------------

    async def _grant_successor(
        self, election: str, state: _State, reason: EndReason, ttl: float
    ) -> bool:
        """End our term by putting the key under the freshest candidate's spare, term + 1.
        False: no live candidate, or it changed or its spare is gone; release as before."""
        holder, keys = state.holder, self._keys(election)
        assert holder is not None
        offer = successor(
            self._offers.of(election),
            holder.node_id,
            lambda o: self._member_clock.age(keys.member(Candidate(o.node_id, "", o.instance))),
            ttl,
        )
        if offer is None:
            return False
        term, acquired_at = state.term + 1, now()
        body = grant_txn(keys, holder, offer, term, acquired_at, reason)
        try:
            answer = await self._call("/v3/kv/txn", body, _DEFAULT_TIMEOUT, "granting the lease")
        except EtcdError as exc:
            if exc.code != _LEASE_NOT_FOUND:
                raise
            return False  # the candidate's spare expired: it is not alive to lead
        if not answer.get("succeeded"):
            return False
        revision = _revision(answer)
        granted = _Holder(offer.node_id, offer.address, offer.instance, term, acquired_at,
                          offer.lease, revision)  # fmt: skip
        self._remember(election, _State(revision, granted, term, revision))
        self._held.pop(election, None)
        self._spares[election] = _Spare(holder.lease, 1, -math.inf)  # as after a release
        return True

    def _granted(self, election: str) -> Grant | None:
        """A release put the key under our spare: tell the engine with the round whose
        keepalive of that spare its expiry counts from."""
        state, me = self._states.get(election), self._me.get(election)
        spare = self._spares.get(election)
        if state is None or me is None or spare is None or spare.kept_in is None:
            return None
        if state.holder is None or not _mine(state, me) or state.holder.lease != spare.id:
            return None
        del self._spares[election]  # it is our lease now
        return Grant(self._answer(election, state, float(spare.ttl)), spare.kept_in)

    def _check_held(self, election: str) -> None:
        """Raise LeaseLost if etcd, as the watch tells it, no longer has our key as our last
        answer saw it: deleted (its lease revoked, or the key removed by hand) or put by
        another. A successor acquires only after that event's revision: stepping down on it,
        with no request, comes before any successor's transaction can answer."""
        held, state = self._held.get(election), self._states.get(election)
        if held is None or state is None or state.revision <= held:
            return
        holder = state.holder
        if holder is not None and holder.modified == held:
            return
        del self._held[election]
        if holder is None:
            raise LeaseLost(
                f"etcd deleted the leader key at revision {state.revision}: "
                "its lease was revoked, or the key removed by hand"
            )
        raise LeaseLost(
            f"etcd gave the leader key to {holder.node_id} (term {holder.term}) "
            f"at revision {holder.modified}"
        )

    def _note_news(self, election: str) -> None:
        """The watch named a holder other than us and other than the last answer's."""
        state, me = self._states.get(election), self._me.get(election)
        if state is None or me is None or state.holder is None or _mine(state, me):
            return
        if _named(state.holder) != self._named.get(election):
            self._news.add(election)

    # ---- acquire, renew, and the spare lease ---------------------------------------------

    async def _acquire(self, ask: Ask, state: _State) -> tuple[_State, Lease | None]:
        """The transaction: take the free key and the next term, or learn who has them."""
        me, spare = ask.me, self._spares.pop(ask.election, None)
        if spare is None or not spare.ttl:  # none, or it had expired
            spare = await self._grant(ask)
        term = max(state.term + 1, ask.min_term)
        now = ask.heard_at
        value = {"node_id": me.node_id, "address": me.address, "instance": me.instance,
                 "term": term, "acquired_at": now}  # fmt: skip
        key, term_key = b64(self._key(ask.election)), b64(self._term_key(ask.election))
        reserved_key = b64(self._reserved_key(ask.election))
        body: dict[str, list[dict[str, Any]]] = {
            # The reservation is as read: none, or this node's (which the acquisition ends).
            "compare": [
                _compare(key, "CREATE", 0),
                _compare(term_key, "MOD", state.term_modified),
                _compare(reserved_key, "CREATE", state.reserved.created),
            ],
            "success": [
                {"request_put": {"key": key, "value": b64(orjson.dumps(value)), "lease": spare.id}},
                {"request_put": {"key": term_key, "value": b64(str(term))}},
                {"request_delete_range": {"key": reserved_key}},
            ],
            "failure": [{"request_range": {"key": k}} for k in (key, term_key, reserved_key)],
        }
        # The member's heartbeat either way; the new term's history record on success.
        # A holder is no candidate: the acquisition withdraws our candidacy.
        keys, heard = self._keys(ask.election), self._heard(ask)
        body["success"] += [*keys.began(me, term, now), *heard, keys.withdraw(me),
                            keys.list_members()]  # fmt: skip
        body["failure"] += [*self._heard(ask, spare), keys.list_members(), keys.list_candidates()]
        # A spare that is not fresh is kept alive with the transaction: its ttl then counts
        # from after the engine's t_send (0: it had expired). A fresh one counts what it has.
        sent_at, refresh = boottime(), not spare.fresh(ask.ttl)
        try:
            answer, kept = await asyncio.gather(
                self._call("/v3/kv/txn", body, ask.left(), "acquiring the lease"),
                self._keepalive(spare.id, ask) if refresh else _nothing(),
            )
        except EtcdError as exc:
            if exc.code != _LEASE_NOT_FOUND:
                raise
            return state, None  # the spare had expired: a new one next time round
        if refresh:
            spare = replace(spare, ttl=kept, kept_at=sent_at, kept_in=kept_in(ask))
        self._note_members(ask.election, answer, me)
        if not answer.get("succeeded"):
            self._note_offers(ask.election, answer)
            if spare.ttl:
                self._spares[ask.election] = spare
            return self._remember(ask.election, self._parse(answer)), None
        revision = _revision(answer)
        self._offers.drop(ask.election, me.node_id, me.instance)
        holder = _Holder(me.node_id, me.address, me.instance, term, now, spare.id, revision)
        state = self._remember(ask.election, _State(revision, holder, term, revision))
        return state, self._answer(ask.election, state, max(0.0, spare.left()))

    async def _renew(self, ask: Ask, state: _State) -> tuple[_State, Lease | None]:
        """Keep our key's lease alive, and check that the key is still ours under it."""
        assert state.holder is not None
        ours, sent_at = state.holder, boottime()
        spare = self._spares.get(ask.election)
        if spare is not None and spare.id == ours.lease:  # granted to us: our lease now
            del self._spares[ask.election]
        kept, state = await asyncio.gather(
            self._keepalive(ours.lease, ask), self._read(ask.election, ask.left(), ask)
        )
        holder = state.holder
        if holder is None or holder.modified != ours.modified:
            if kept:  # the key went (deleted by hand) but the lease lives: a spare
                self._spares[ask.election] = _Spare(ours.lease, kept, sent_at, kept_in(ask))
            return state, None
        # A lease the lessor found expired is lost even while its key still shows.
        return state, self._answer(ask.election, state, float(kept))

    async def _look(self, ask: Ask) -> _State:
        """A follower's round: read the election, and tend the spare meanwhile; without a
        spare, grant one first, so that this very round's heartbeat offers it."""
        spare = self._spares.get(ask.election)
        if spare is None or not spare.ttl:
            await self._tend(ask)
            return await self._read(ask.election, ask.left(), ask)
        state, _ = await asyncio.gather(self._read(ask.election, ask.left(), ask), self._tend(ask))
        return state

    async def _tend(self, ask: Ask) -> None:
        """Have a live spare: grant one, or keep it alive before it stops being fresh."""
        spare = self._spares.get(ask.election)
        try:
            if spare is None or not spare.ttl:  # none, or it had expired
                self._spares[ask.election] = await self._grant(ask)
            elif spare.left() < _TEND * ask.ttl:
                sent_at = boottime()
                kept = await self._keepalive(spare.id, ask)
                if self._spares.get(ask.election) is spare:
                    self._spares[ask.election] = replace(
                        spare, ttl=kept, kept_at=sent_at, kept_in=kept_in(ask)
                    )
        except BackendError:
            return  # the round's own request says what is wrong

    async def _grant(self, ask: Ask) -> _Spare:
        sent_at = boottime()
        lease, ttl = await self._grant_lease(ask.ttl, ask.left())
        return _Spare(lease, ttl, sent_at, kept_in(ask))

    async def _grant_lease(self, ttl: float, timeout: float) -> tuple[int, int]:
        """A new etcd lease of at least ``ttl`` (whole seconds): its id and its ttl."""
        body = {"TTL": max(1, math.ceil(ttl))}
        answer = await self._call("/v3/lease/grant", body, timeout, "granting a lease")
        lease, granted = _int(answer.get("ID")), _int(answer.get("TTL"))
        if not lease or not granted:
            raise BackendUnavailable(f"granting a lease: etcd answered {answer!r}")
        return lease, granted

    async def _keepalive(self, lease: int, ask: Ask) -> int:
        """The lease's ttl from now on; 0 if it has expired."""
        body = {"ID": lease}
        answer = await self._call("/v3/lease/keepalive", body, ask.left(), "renewing the lease")
        return _int(answer.get("result", {}).get("TTL"))

    # ---- reading, remembering and answering ----------------------------------------------

    async def _read(self, election: str, timeout: float, ask: Ask | None = None) -> _State:
        """The keys of an election and its members, in one transaction (one revision);
        with ``ask``, that member's heartbeat too."""
        names = (self._key(election), self._term_key(election), self._reserved_key(election))
        ranges = [{"request_range": {"key": b64(name)}} for name in names]
        keys = self._keys(election)
        spare = self._spares.get(election)
        ranges += [*self._heard(ask, spare), keys.list_members(), keys.list_candidates()]
        answer = await self._call("/v3/kv/txn", {"success": ranges}, timeout, "reading the lease")
        self._note_members(election, answer, ask.me if ask else None)
        self._note_offers(election, answer)
        await self._prune(election, max(0.001, timeout / 2))
        return self._remember(election, self._parse(answer))

    def _heard(self, ask: Ask | None, spare: _Spare | None = None) -> list[dict[str, Any]]:
        """The operations of a member's heartbeat (and of a term it lost etcd in), and of
        its candidacy: withdrawn when not campaigning, else offering ``spare``."""
        if ask is None:
            return []
        keys = self._keys(ask.election)
        lost = [keys.lost(ask.lost_term)] if ask.lost_term else []
        return [keys.heard(ask.me, ask.ttl, ask.heard_at), *lost, *self._offer(ask, spare)]

    def _offer(self, ask: Ask, spare: _Spare | None) -> list[dict[str, Any]]:
        """Withdraw the candidacy when not campaigning; offer a spare the candidate key does
        not name yet, kept alive by a known round (etcd_grant.py)."""
        me, keys = ask.me, self._keys(ask.election)
        if not ask.campaigning:
            return [keys.withdraw(me)]
        state = self._states.get(ask.election)
        if spare is None or spare.kept_in is None or spare.left() <= 0:
            return []
        if state is not None and _mine(state, me):
            return []
        offered = self._offers.of(ask.election).get((me.node_id, me.instance))
        if offered is not None and offered.lease == spare.id:
            return []
        return [keys.stand(me, spare.id)]

    def _heard_at(self) -> str:
        """The wall clock in milliseconds, made strictly increasing: a grant names the round
        it counts from by it, so no two rounds of this process may share one."""
        stamp = dt.datetime.fromisoformat(now())
        if stamp <= self._last_heard_at:
            stamp = self._last_heard_at + dt.timedelta(milliseconds=1)
        self._last_heard_at = stamp
        return stamp.isoformat(timespec="milliseconds")

    def _note_offers(self, election: str, answer: Any) -> None:
        self._offers.read(election, self._keys(election), answer, _revision(answer))

    def _note_members(self, election: str, answer: Any, me: Candidate | None) -> None:
        keys = self._keys(election)
        self._members[election] = self._member_clock.members(keys.listed(answer), me, keys)

    async def _prune(self, election: str, timeout: float) -> None:
        """Delete the members silent for long, each only if still unchanged (rare: one
        request per member that went away)."""
        keys = self._keys(election)
        for key, revision in self._member_clock.silent(self._members.get(election, ()), keys):
            offered = key.replace(keys.members, keys.candidates, 1)  # its candidacy goes too
            body = {"compare": [_compare(b64(key), "MOD", revision)],
                    "success": [{"request_delete_range": {"key": b64(k)}}
                                for k in (key, offered)]}  # fmt: skip
            with contextlib.suppress(BackendError):
                await self._call("/v3/kv/txn", body, timeout, "pruning a member")

    def _parse(self, answer: Any) -> _State:
        """The leader, term and reserved keys' ranges of a transaction (missing ones read as
        absent)."""
        kvs: list[dict[str, Any]] = [
            (r.get("response_range", {}).get("kvs") or [{}])[0] for r in answer.get("responses", [])
        ]
        leader, term, reserved = [*kvs, {}, {}, {}][:3]
        holder = _holder(leader) if leader else None
        stored = _int(unb64(term.get("value", "")).decode(errors="replace"))
        held, modified = holder.term if holder else 0, _int(term.get("mod_revision"))
        return _State(_revision(answer), holder, max(stored, held), modified, reservation(reserved))

    def _remember(self, election: str, state: _State) -> _State:
        known = self._states.get(election)
        if known is None or state.revision >= known.revision:
            self._states[election] = state
        return state

    async def _reserved_answer(self, election: str, state: _State, timeout: float) -> Lease:
        """A free lease, with what is left of its reservation (etcd's lessor's count)."""
        if not state.reserved.node_id:
            return self._answer(election, state, None)
        body = {"ID": state.reserved.lease}
        lease = await self._call("/v3/kv/lease/timetolive", body, timeout, "reading it")
        # -1: expired, but its key lasts until the lessor's next sweep (its deletion is an
        # event that wakes every waiter): reserved for a moment more.
        left = max(float(lease.get("TTL", -1)), _LESSOR_SWEEP)
        return self._answer(election, state, None, left)

    def _answer(
        self, election: str, state: _State, expires_in: float | None, reserved_in: float = 0.0
    ) -> Lease:
        self._answered[election] = max(self._answered.get(election, 0), state.revision)
        holder, members = state.holder, self._members.get(election, ())
        self._news.discard(election)
        self._named[election] = None if holder is None else _named(holder)
        me = self._me.get(election)
        if holder is not None and me is not None and _mine(state, me):
            self._held[election] = holder.modified  # what a watch event can prove gone
        else:
            self._held.pop(election, None)
        if holder is None:
            to = state.reserved.node_id if reserved_in > 0 else ""
            return Lease(election, None, "", state.term, None, None, reserved_for=to,
                         reserved_in=reserved_in if to else 0.0, members=members)  # fmt: skip
        # Every answer that finds the key is a new version: proof that etcd keeps the lease alive
        # (its lessor deletes the key otherwise), so the engine never waits to take it over.
        version = f"{holder.modified}.{next(self._answers)}"
        return Lease(election, holder.node_id, holder.address, holder.term,
                     _when(holder.acquired_at), expires_in, instance=holder.instance,
                     version=version, members=members)  # fmt: skip

    def _on_event(self, key: str, kv: dict[str, Any] | None, revision: int) -> str | None:
        """A watch event (kv None: deleted): update what we know; the election it concerns."""
        election, _, what = key[len(self._prefix) :].partition("/")
        if what.startswith("candidates/"):  # a leader's release reads the offers of the moment
            self._offers.event(election, self._keys(election), key, kv, revision)
        elif what.startswith("members/") and kv is not None:  # their age too
            self._member_clock.saw(key, revision)
        if what not in ("leader", "term", "reserved"):
            return None
        known = self._states.get(election)
        if known is None or revision < known.revision:
            return election
        if what == "leader":
            holder = None if kv is None else _holder(kv)
            self._states[election] = replace(known, revision=revision, holder=holder)
        elif what == "reserved":
            self._states[election] = replace(known, revision=revision, reserved=reservation(kv))
        elif kv is not None:
            term = _int(unb64(kv.get("value", "")).decode(errors="replace"))
            self._states[election] = replace(
                known, revision=revision, term=term, term_modified=revision
            )
        return election

    async def _call(self, path: str, body: dict[str, Any], timeout: float, doing: str) -> Any:
        if timeout <= 0:
            raise BackendUnavailable(f"{doing}: no time left")
        return await self._etcd.call(path, body, timeout, doing)

    def _keys(self, election: str) -> Keys:
        return Keys(f"{self._prefix}{election}/")

    def _key(self, election: str) -> str:
        return self._keys(election).leader

    def _term_key(self, election: str) -> str:
        return self._keys(election).term

    def _reserved_key(self, election: str) -> str:
        return f"{self._prefix}{election}/reserved"


async def _nothing() -> int:
    return 0  # no keepalive was needed


def _theirs(state: _State, me: Candidate) -> bool:
    return state.holder is not None and not _mine(state, me)


def _named(holder: _Holder) -> tuple[str, str, int]:
    return holder.node_id, holder.instance, holder.term


def _mine(state: _State, me: Candidate) -> bool:
    holder = state.holder
    return holder is not None and (holder.node_id, holder.instance) == (me.node_id, me.instance)
