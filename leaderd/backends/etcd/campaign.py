"""The campaign: read, acquire or renew, each under the spare or the lease it has
(spare.py), until etcd's answer says which (docs/etcd.md)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from ...clock import boottime
from ..base import BackendUnavailable, Lease
from .election import EtcdElection
from .errors import EtcdError
from .spare import EtcdSpares, no_keepalive
from .state import Holder, Round, Spare, State, kept_in, mine, revision_of, state_of
from .transactions import acquire_txn
from .view import LEASE_NOT_FOUND


class EtcdCampaign(EtcdSpares):
    """The campaign's transactions of one etcd backend."""

    async def _campaign(self, e: EtcdElection, ask: Round, state: State | None) -> Lease:
        """Read, acquire or renew, until etcd's answer says which (three races at most)."""
        candidate, fresh = ask.me, False
        for _ in range(3):
            # Another holder (or nothing known) is always read again; a key a watch event said
            # was freed, or our own, go straight to their transaction or keepalive.
            if state is None or not (fresh or state.holder is None or mine(state, candidate)):
                state = await self._look(e, ask)
            if state.holder is None and e.fenced(candidate, ask.ttl) > 0:
                state = await self._look(e, ask)  # this round's heartbeat; the spare kept
                if state.holder is None and e.fenced(candidate, ask.ttl) > 0:
                    return self._answer(e, state, None)  # free, but its holder may still lead
            if state.reserved_against(candidate.node_id):
                return await self._reserved_answer(e, await self._look(e, ask), ask.left())
            if state.holder is None:
                state, lease = await self._acquire(e, ask, state)
            elif mine(state, candidate):
                state, lease = await self._renew(e, ask, state)
            else:
                return self._answer(e, state, None)
            if lease is not None:
                return lease
            fresh = True  # each path ends with what etcd has just said
        raise BackendUnavailable(f"acquiring election {e.name}: lost three races")

    async def _look(self, e: EtcdElection, ask: Round) -> State:
        """A follower's round: read the election, and tend the spare meanwhile; without a
        spare, create one first, so that this very round's heartbeat offers it."""
        spare = e.spare
        if spare is None or not spare.ttl:
            await self._tend(e, ask)
            return await self._read(e, ask.left(), ask)
        state, _ = await asyncio.gather(self._read(e, ask.left(), ask), self._tend(e, ask))
        return state

    async def _acquire(
        self, e: EtcdElection, ask: Round, state: State
    ) -> tuple[State, Lease | None]:
        """The transaction: take the free key and the next term, or learn who has them."""
        me, spare = ask.me, e.spare
        e.spare = None
        if spare is None or not spare.ttl:  # none, or it had expired
            spare = await self._new_spare(ask)
        term = max(state.term + 1, ask.min_term)
        body = acquire_txn(e, ask, state, term, spare)
        # A spare that is not fresh is kept alive with the transaction: its ttl then counts
        # from after the engine's t_send (0: it had expired). A fresh one counts what it has.
        sent_at, refresh = boottime(), not spare.fresh(ask.ttl)
        try:
            answer, kept = await asyncio.gather(
                self._call("/v3/kv/txn", body, ask.left(), "acquiring the lease"),
                self._keepalive(spare.id, ask) if refresh else no_keepalive(),
            )
        except EtcdError as exc:
            if exc.code != LEASE_NOT_FOUND:
                raise
            return state, None  # the spare had expired: a new one next time round
        if refresh:
            spare = replace(spare, ttl=kept, kept_at=sent_at, kept_in=kept_in(ask))
        e.heard_members(answer, me)
        if not answer.get("succeeded"):
            e.heard_offers(answer)
            if spare.ttl:
                e.spare = spare
            return e.remember(state_of(answer)), None
        revision = revision_of(answer)
        e.offers.drop(me.node_id, me.instance)
        e.trimmed = term  # the acquisition trimmed the history
        holder = Holder(me.node_id, me.address, me.instance, term, ask.heard_at, spare.id,
                        revision)  # fmt: skip
        state = e.remember(State(revision, holder, term, revision))
        return state, self._answer(e, state, max(0.0, spare.left()))

    async def _renew(self, e: EtcdElection, ask: Round, state: State) -> tuple[State, Lease | None]:
        """Keep our key's lease alive, and check that the key is still ours under it."""
        assert state.holder is not None
        ours, sent_at = state.holder, boottime()
        if e.spare is not None and e.spare.id == ours.lease:  # granted to us: our lease now
            e.spare = None
        kept, state = await asyncio.gather(
            self._keepalive(ours.lease, ask), self._read(e, ask.left(), ask)
        )
        holder = state.holder
        if holder is None or holder.modified != ours.modified:
            if kept:  # the key went (deleted by hand) but the lease lives: a spare
                e.spare = Spare(ours.lease, kept, sent_at, kept_in(ask))
            return state, None
        # A lease the lessor found expired is lost even while its key still shows.
        return state, self._answer(e, state, float(kept))
