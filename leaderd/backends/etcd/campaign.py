"""Acquire, renew, and the spare lease: a standby keeps an etcd lease granted in advance, which
its acquisition puts the leader key under and which it offers to a releasing leader
(docs/etcd.md)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from typing import Any

import orjson

from ...clock import boottime
from ..base import (
    BackendError,
    BackendUnavailable,
    Lease,
)
from .gateway import EtcdError, b64
from .state import TEND as _TEND
from .state import Holder as _Holder
from .state import Round, kept_in
from .state import Spare as _Spare
from .state import State as _State
from .state import compare as _compare
from .state import int_of as _int
from .state import revision_of as _revision
from .view import LEASE_NOT_FOUND, EtcdView


class EtcdCampaign(EtcdView):
    """The campaign's transactions and the lease keepalives of one etcd backend."""

    async def _acquire(self, ask: Round, state: _State) -> tuple[_State, Lease | None]:
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
            if exc.code != LEASE_NOT_FOUND:
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

    async def _renew(self, ask: Round, state: _State) -> tuple[_State, Lease | None]:
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

    async def _look(self, ask: Round) -> _State:
        """A follower's round: read the election, and tend the spare meanwhile; without a
        spare, grant one first, so that this very round's heartbeat offers it."""
        spare = self._spares.get(ask.election)
        if spare is None or not spare.ttl:
            await self._tend(ask)
            return await self._read(ask.election, ask.left(), ask)
        state, _ = await asyncio.gather(self._read(ask.election, ask.left(), ask), self._tend(ask))
        return state

    async def _tend(self, ask: Round) -> None:
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

    async def _grant(self, ask: Round) -> _Spare:
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

    async def _keepalive(self, lease: int, ask: Round) -> int:
        """The lease's ttl from now on; 0 if it has expired."""
        body = {"ID": lease}
        answer = await self._call("/v3/lease/keepalive", body, ask.left(), "renewing the lease")
        return _int(answer.get("result", {}).get("TTL"))


async def _nothing() -> int:
    return 0  # no keepalive was needed
