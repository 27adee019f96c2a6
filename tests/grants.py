"""Helpers of the one-write hand-over tests of every backend that grants (docs/algorithm.md,
"One-write hand-over"): the heartbeat a request was heard at, and waiting for a grant."""

from __future__ import annotations

import asyncio
import datetime as dt

from leaderd.backends import Backend, Candidate
from leaderd.backends.base import Grant, Lease
from tests.backend_calls import ask, release


def heard(lease: Lease, who: Candidate) -> dt.datetime:
    """When the request that answered ``lease`` was heard from ``who`` (backend clock)."""
    me = (who.node_id, who.instance)
    member = next(m for m in lease.members if (m.node_id, m.instance) == me)
    assert member.heard_at is not None
    return member.heard_at


async def wait_grant(backend: Backend, election: str) -> Grant:
    """The grant ``backend``'s waiter is told of, within 3 s."""
    async with asyncio.timeout(3):
        while True:
            grant = await backend.wait_for_change(election, 1.0)
            if grant is not None:
                return grant


async def not_granted_back(a: Backend, b: Backend, election: str, ttl: float) -> None:
    """A's renewals said it campaigned; once it released (stopping), the next leader's
    release must not hand the lease back to it (the podman stop of both containers)."""
    first, second = Candidate("node-a", "10.0.0.1:80"), Candidate("node-b", "10.0.0.2:80")
    held = await ask(a, election, first, ttl=ttl, timeout=5)
    await ask(b, election, second, ttl=ttl, timeout=5)
    await release(a, election, first, held.term, grant=True)
    await release(b, election, second, held.term + 1, grant=True)
    seen = await b.observe(election)
    assert seen.holder is None and seen.term == held.term + 1
