"""The spare: an etcd lease a standby creates in advance and keeps alive, which its
acquisition puts the leader key under and which it offers to a releasing leader
(docs/etcd.md, "Spare lease"). Also the etcd leases of the etcd backend themselves:
creating one, keeping one alive."""

from __future__ import annotations

import math
from dataclasses import replace

from ...clock import boottime
from ..base import BackendError, BackendUnavailable
from .election import EtcdElection
from .state import TEND, Round, Spare, int_of, kept_in
from .view import EtcdView


class EtcdSpares(EtcdView):
    """The etcd leases of one etcd backend: the spares and their keepalives."""

    async def _tend(self, e: EtcdElection, ask: Round) -> None:
        """Have a live spare: create one, or keep it alive before it stops being fresh."""
        spare = e.spare
        try:
            if spare is None or not spare.ttl:  # none, or it had expired
                e.spare = await self._new_spare(ask)
            elif spare.left() < TEND * ask.ttl:
                sent_at = boottime()
                kept = await self._keepalive(spare.id, ask)
                if e.spare is spare:
                    e.spare = replace(spare, ttl=kept, kept_at=sent_at, kept_in=kept_in(ask))
        except BackendError:
            return  # the round's own request says what is wrong

    async def _new_spare(self, ask: Round) -> Spare:
        sent_at = boottime()
        lease, ttl = await self._new_etcd_lease(ask.ttl, ask.left())
        return Spare(lease, ttl, sent_at, kept_in(ask))

    async def _new_etcd_lease(self, ttl: float, timeout: float) -> tuple[int, int]:
        """A new etcd lease of at least ``ttl`` (whole seconds): its id and its ttl."""
        body = {"TTL": max(1, math.ceil(ttl))}
        answer = await self._call("/v3/lease/grant", body, timeout, "creating an etcd lease")
        lease, ttl_given = int_of(answer.get("ID")), int_of(answer.get("TTL"))
        if not lease or not ttl_given:
            raise BackendUnavailable(f"creating an etcd lease: etcd answered {answer!r}")
        return lease, ttl_given

    async def _keepalive(self, lease: int, ask: Round) -> int:
        """The lease's ttl from now on; 0 if it has expired."""
        body = {"ID": lease}
        answer = await self._call("/v3/lease/keepalive", body, ask.left(), "renewing the lease")
        return int_of(answer.get("result", {}).get("TTL"))


async def no_keepalive() -> int:
    return 0  # no keepalive was needed
