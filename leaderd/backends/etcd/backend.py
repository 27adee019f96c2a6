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
* Standbys wake on an etcd watch of the prefix (watch.py) and keep a lease granted in
  advance (a spare), which they offer in a candidate key: a graceful release puts the key
  under the freshest candidate's spare with the next term (grant.py), and that standby
  leads on the watch event alone. A hand-over is one transaction and one watch event.

This module is the interface, the release and the hand-over; campaign.py acquires, renews
and tends the spare; view.py reads, remembers and answers.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ...clock import boottime
from ..asks import Ask, Heir, Release
from ..base import (
    Backend,
    BackendUnavailable,
    Candidate,
    Capabilities,
    Capability,
    Grant,
    Lease,
    LeaseLost,
)
from ..records import EndReason, Tenure, end_text
from .campaign import EtcdCampaign
from .gateway import EtcdError, EtcdSettings, b64, prefix_end
from .grant import freshest_heir, grant_txn
from .records import now, tenures
from .state import Holder as _Holder
from .state import Round, kept_in
from .state import Spare as _Spare
from .state import State as _State
from .state import compare as _compare
from .state import revision_of as _revision
from .view import DEFAULT_TIMEOUT, LEASE_NOT_FOUND, mine, named, theirs

log = logging.getLogger(__name__)


class EtcdBackend(EtcdCampaign, Backend):
    kind = "etcd"
    capabilities = Capabilities(
        {
            Capability.TAKEOVER: "etcd's lessor deletes an expired key: it is then free, never "
            "an expired lease to take over by its version",
            Capability.VERSIONED_RELEASE: "a keepalive does not move the key's mod revision; "
            "the engine never leads on a term whose release is in doubt (docs/etcd.md)",
        }
    )

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
        await self._call("/v3/kv/range", body, DEFAULT_TIMEOUT, "reading the elections")

    async def observe(
        self, election: str, candidate: Candidate | None = None, ttl: float = 0.0
    ) -> Lease:
        give_up = boottime() + DEFAULT_TIMEOUT
        ask = None
        if candidate is not None:
            ask = Round(election, candidate, ttl, 0, give_up, 0, False, self._heard_at())
        state = await self._read(election, DEFAULT_TIMEOUT, ask)
        answer = await self._observed(election, state)
        return answer if ask is None else replace(answer, heartbeat=kept_in(ask))

    async def _observed(self, election: str, state: _State) -> Lease:
        """The answer of an observe: a held lease with what its lessor says is left."""
        if state.holder is None:
            return await self._reserved_answer(election, state, DEFAULT_TIMEOUT)
        body = {"ID": state.holder.lease}
        lease = await self._call("/v3/kv/lease/timetolive", body, DEFAULT_TIMEOUT, "reading it")
        return self._answer(election, state, max(0.0, float(lease.get("TTL", -1))))  # -1: gone

    async def acquire_or_renew(self, ask: Ask) -> Lease:
        # A takeover version is never needed: etcd's lessor ends an unrenewed lease itself.
        election, candidate, lost_term = ask.election, ask.candidate, ask.lost_term
        give_up = boottime() + ask.timeout
        heard_at = self._heard_at()
        round_ = Round(
            election, candidate, ask.ttl, ask.min_term, give_up, lost_term, True, heard_at
        )
        self._me[election] = candidate
        state = self._states.get(election)
        news = election in self._news and not lost_term  # a lost term is recorded by a read
        if news and state is not None and theirs(state, candidate):
            # etcd committed what the watch event says: name that holder now, without a
            # request (cached: it leads no one); the next round reads and heartbeats as usual.
            return replace(self._answer(election, state, None), cached=True)
        # Every path below wrote this round's heartbeat: the answer names it, and no other.
        return replace(await self._campaign(round_, state), heartbeat=kept_in(round_))

    async def _campaign(self, ask: Round, state: _State | None) -> Lease:
        """Read, acquire or renew, until etcd's answer says which (three races at most)."""
        election, candidate, fresh = ask.election, ask.me, False
        for _ in range(3):
            # Another holder (or nothing known) is always read again; a key a watch event said
            # was freed, or our own, go straight to their transaction or keepalive.
            if state is None or not (fresh or state.holder is None or mine(state, candidate)):
                state = await self._look(ask)
            if state.reserved_against(candidate.node_id):
                return await self._reserved_answer(election, await self._look(ask), ask.left())
            if state.holder is None:
                state, lease = await self._acquire(ask, state)
            elif mine(state, candidate):
                state, lease = await self._renew(ask, state)
            else:
                return self._answer(election, state, None)
            if lease is not None:
                return lease
            fresh = True  # each path ends with what etcd has just said
        raise BackendUnavailable(f"acquiring election {election}: lost three races")

    async def release(self, release: Release) -> None:
        # ``version`` is not compared: a keepalive does not move the key's mod revision, so
        # no revision tells a renewal apart; the engine never leads on a term whose release
        # is in doubt (docs/etcd.md, "A release that lands late").
        election, candidate, term = release.election, release.candidate, release.term
        reason, reserve_for, ttl = release.reason, release.reserve_for, release.ttl
        state = self._states.get(election)
        if state is None or not mine(state, candidate):
            state = await self._read(election, DEFAULT_TIMEOUT)
        holder = state.holder
        if holder is None or not mine(state, candidate) or holder.term != term:
            return
        heir = None if reserve_for else release.heir
        if heir is not None and await self._grant_heir(election, state, reason, heir):
            return
        key = b64(self._key(election))
        success: list[dict[str, Any]] = [
            {"request_delete_range": {"key": key}},
            self._keys(election).released(term, end_text(reason, reserve_for)),
        ]
        if reserve_for:  # the reserved key lives under a lease of its own: one ttl
            granted = await self._grant_lease(ttl, DEFAULT_TIMEOUT)
            reserved = {"key": b64(self._reserved_key(election)), "value": b64(reserve_for)}
            success.append({"request_put": {**reserved, "lease": granted[0]}})
        body = {"compare": [_compare(key, "MOD", holder.modified)], "success": success}
        answer = await self._call("/v3/kv/txn", body, DEFAULT_TIMEOUT, "releasing the lease")
        if answer.get("succeeded"):
            self._remember(election, replace(state, revision=_revision(answer), holder=None))
            self._held.pop(election, None)
            # The lease outlives its key: it is the spare of this node's next acquisition.
            self._spares[election] = _Spare(holder.lease, 1, -math.inf)  # ttl: a keepalive says

    async def history(self, election: str, limit: int) -> list[Tenure]:
        body = {"success": self._keys(election).read_history(limit)}
        return tenures(election, await self._call("/v3/kv/txn", body, DEFAULT_TIMEOUT, "reading"))

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

    # ---- the one-write hand-over (grant.py) --------------------------------------------

    async def _grant_heir(
        self, election: str, state: _State, reason: EndReason | str, heir: Heir
    ) -> bool:
        """End our term by putting the key under the spare of the freshest candidate ``heir``
        allows, term + 1. False: none, or it changed or its spare is gone; release as before."""
        holder, keys = state.holder, self._keys(election)
        assert holder is not None
        ttls = {(m.node_id, m.instance): m.ttl for m in self._members.get(election, ())}
        offer = freshest_heir(
            self._offers.of(election),
            heir,
            lambda o: self._member_clock.age(keys.member(Candidate(o.node_id, "", o.instance))),
            lambda o: ttls.get((o.node_id, o.instance)),
        )
        if offer is None:
            return False
        term, acquired_at = state.term + 1, now()
        body = grant_txn(keys, holder, offer, term, acquired_at, reason)
        try:
            answer = await self._call("/v3/kv/txn", body, DEFAULT_TIMEOUT, "granting the lease")
        except EtcdError as exc:
            if exc.code != LEASE_NOT_FOUND:
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
        if state.holder is None or not mine(state, me) or state.holder.lease != spare.id:
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
        if state is None or me is None or state.holder is None or mine(state, me):
            return
        if named(state.holder) != self._named.get(election):
            self._news.add(election)
