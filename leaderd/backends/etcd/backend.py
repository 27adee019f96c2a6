"""etcd:// and etcd+https:// — one key per election under an etcd lease (docs/etcd.md).

``<prefix><election>/leader`` holds the holder as JSON under the holder's lease;
``<prefix><election>/term`` holds the last term begun: no lease, never deleted.

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
* An expired key is gone, so etcd reports the election free; a standby acquires a key etcd
  deleted only one ttl after it last saw the holder's heartbeat (fence.py). The lessor
  runs on the etcd leader's monotonic clock, which no wall-clock step moves, and a present
  key is never taken over: ``takeover`` is not needed (docs/algorithm.md, docs/etcd.md).
* Standbys wake on an etcd watch of the prefix (watch.py) and keep an etcd lease created in
  advance (a spare, spare.py), which they offer in a candidate key: a graceful release puts
  the key under the freshest candidate's spare with the next term (grant.py), and that
  standby leads on the watch event alone. A hand-over is one transaction and one watch event.

This module is the interface, the release and the hand-over; campaign.py acquires and
renews; spare.py keeps the spare; view.py reads and answers; election.py is what is known of
one election; transactions.py and grant.py make the transactions' bodies; gateway.py sends
them.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ...clock import boottime
from ..asks import Ask, Heir, Release
from ..base import Backend, Candidate, Capabilities, Capability, Grant, Lease
from ..records import EndReason, Tenure, end_text
from .campaign import EtcdCampaign
from .election import EtcdElection
from .errors import EtcdError
from .gateway import EtcdSettings, b64, prefix_end
from .grant import freshest_heir, grant_txn
from .line import ReleaseLine
from .records import now, tenures
from .state import Holder, Round, Spare, State, kept_in, mine, revision_of, theirs
from .transactions import release_txn
from .view import DEFAULT_TIMEOUT, LEASE_NOT_FOUND

log = logging.getLogger(__name__)
_WATCH_START = 2.0  # seconds open() waits for the watch stream: a slow one only costs a round


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

    @property
    def line(self) -> ReleaseLine:
        """The connection a release is written on (line.py)."""
        return self._line

    async def open(self, elections: Sequence[str]) -> None:
        """Check that etcd answers (TLS, credentials); start the watch either way."""
        self._watch.start()
        body = {"key": b64(self._prefix), "range_end": prefix_end(self._prefix), "count_only": True}
        await self._call("/v3/kv/range", body, DEFAULT_TIMEOUT, "reading the elections")
        # The first reads then come after the stream's start, which wakes no standby's wait.
        await self._watch.created(within=_WATCH_START)

    async def observe(
        self, election: str, candidate: Candidate | None = None, ttl: float = 0.0
    ) -> Lease:
        e, give_up = self._election(election), boottime() + DEFAULT_TIMEOUT
        ask = None
        if candidate is not None:
            ask = Round(candidate, ttl, 0, give_up, 0, False, self._heard_at())
        state = await self._read(e, DEFAULT_TIMEOUT, ask)
        answer = await self._observed(e, state)
        return answer if ask is None else replace(answer, heartbeat=kept_in(ask))

    async def _observed(self, e: EtcdElection, state: State) -> Lease:
        """The answer of an observe: a held lease with what its lessor says is left."""
        if state.holder is None:
            return await self._reserved_answer(e, state, DEFAULT_TIMEOUT)
        body = {"ID": state.holder.lease}
        lease = await self._call("/v3/kv/lease/timetolive", body, DEFAULT_TIMEOUT, "reading it")
        return self._answer(e, state, max(0.0, float(lease.get("TTL", -1))))  # -1: gone

    async def acquire_or_renew(self, ask: Ask) -> Lease:
        # A takeover version is never needed: etcd's lessor ends an unrenewed lease itself.
        e, candidate, lost_term = self._election(ask.election), ask.candidate, ask.lost_term
        await self._wait_out_fence(e, ask)
        give_up = boottime() + ask.timeout
        heard_at = self._heard_at()
        round_ = Round(candidate, ask.ttl, ask.min_term, give_up, lost_term, True, heard_at)
        e.asker = candidate
        state = e.state
        news = e.news and not lost_term  # a lost term is recorded by a read
        if news and state is not None and theirs(state, candidate):
            # etcd committed what the watch event says: name that holder now, without a
            # request (cached: it leads no one); the next round reads and heartbeats as usual.
            return replace(self._answer(e, state, None), cached=True)
        # Every path below wrote this round's heartbeat: the answer names it, and no other.
        lease = await self._campaign(e, round_, state)
        self._line.keep_open()  # open before it leads: an heir may release at once
        return replace(lease, heartbeat=kept_in(round_))

    async def _wait_out_fence(self, e: EtcdElection, ask: Ask) -> None:
        """A free key etcd deleted under a holder that may still lead (fence.py): wait out
        its deadline within what the engine lets a request block (``ask.wait``)."""
        if e.state is not None and e.state.holder is None:
            left = e.fenced(ask.candidate, ask.ttl)
            if left > 0:
                await asyncio.sleep(min(left, ask.wait))

    async def release(self, release: Release) -> None:
        # ``version`` is not compared: a keepalive does not move the key's mod revision, so
        # no revision tells a renewal apart; the engine never leads on a term whose release
        # is in doubt (docs/etcd.md, "A release that lands late").
        e, candidate, term = self._election(release.election), release.candidate, release.term
        reason, reserve_for, ttl = release.reason, release.reserve_for, release.ttl
        state = e.state
        if state is None or not mine(state, candidate):
            state = await self._read(e, DEFAULT_TIMEOUT)
        holder = state.holder
        if holder is None or not mine(state, candidate) or holder.term != term:
            return
        heir = None if reserve_for else release.heir
        if heir is not None and await self._grant_heir(e, state, reason, heir):
            return
        ended = e.keys.released(term, end_text(reason, reserve_for))  # stamped now
        reserved = None
        if reserve_for:  # the reserved key lives under an etcd lease of its own: one ttl
            reserved = (reserve_for, (await self._new_etcd_lease(ttl, DEFAULT_TIMEOUT))[0])
        body = release_txn(e.keys, holder, ended, reserved)
        answer = await self._send_release(body, "releasing the lease")
        if answer.get("succeeded"):
            e.remember(replace(state, revision=revision_of(answer), holder=None))
            e.held = None
            # The lease outlives its key: it is the spare of this node's next acquisition.
            e.spare = Spare(holder.lease, 1, -math.inf)  # ttl: a keepalive says

    async def _send_release(self, body: dict[str, Any], doing: str) -> Any:
        """A release's transaction: on the release line, which has half the time (line.py),
        and through the client if the line could not carry it."""
        give_up = boottime() + DEFAULT_TIMEOUT
        answer = await self._line.post("/v3/kv/txn", body, DEFAULT_TIMEOUT / 2, doing)
        if answer is None:
            answer = await self._call("/v3/kv/txn", body, give_up - boottime(), doing)
        return answer

    async def history(self, election: str, limit: int) -> list[Tenure]:
        body = {"success": self._election(election).keys.read_history(limit)}
        return tenures(election, await self._call("/v3/kv/txn", body, DEFAULT_TIMEOUT, "reading"))

    async def wait_for_change(self, election: str, timeout: float) -> Grant | None:
        e = self._election(election)
        await self._watch.wait(election, e.answered, timeout)
        # Told once: a wake-up that no successful request follows (etcd down) is not news again.
        e.answered = max(e.answered, self._watch.heard(election))
        e.check_held()
        grant = self._granted(e)
        if grant is None:
            e.note_news()
        return grant

    async def close(self) -> None:
        # Spares are left to expire: a revoke now would compete with a successor's transaction.
        await self._watch.stop()
        for e in self._elections.values():
            e.spare = None
        await self._line.close()
        await self._etcd.close()

    # ---- the one-write hand-over (grant.py) --------------------------------------------

    async def _grant_heir(
        self, e: EtcdElection, state: State, reason: EndReason | str, heir: Heir
    ) -> bool:
        """End our term by putting the key under the spare of the freshest candidate ``heir``
        allows, term + 1. False: none, or it changed or its spare is gone; release as before."""
        holder, keys = state.holder, e.keys
        assert holder is not None
        ttls = {(m.node_id, m.instance): m.ttl for m in e.members}
        offer = freshest_heir(
            e.offers.known,
            heir,
            lambda o: e.clock.age(keys.member(Candidate(o.node_id, "", o.instance))),
            # The offer's own ttl: a standby that stood since our last read is no member we know.
            lambda o: o.ttl or ttls.get((o.node_id, o.instance)),
        )
        if offer is None:
            return False
        term, acquired_at = state.term + 1, now()
        body = grant_txn(keys, holder, offer, term, acquired_at, reason)
        try:
            answer = await self._send_release(body, "granting the lease")
        except EtcdError as exc:
            if exc.code != LEASE_NOT_FOUND:
                raise
            return False  # the candidate's spare expired: it is not alive to lead
        if not answer.get("succeeded"):
            return False
        revision = revision_of(answer)
        granted = Holder(offer.node_id, offer.address, offer.instance, term, acquired_at,
                         offer.lease, revision)  # fmt: skip
        e.remember(State(revision, granted, term, revision))
        e.held = None
        e.spare = Spare(holder.lease, 1, -math.inf)  # as after a release
        return True

    def _granted(self, e: EtcdElection) -> Grant | None:
        """A release put the key under our spare: tell the engine with the round whose
        keepalive of that spare its expiry counts from."""
        spare = e.granted_spare()
        if spare is None or spare.kept_in is None or e.state is None:
            return None
        return Grant(self._answer(e, e.state, float(spare.ttl)), spare.kept_in)
