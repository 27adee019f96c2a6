"""Helpers of the one-write hand-over tests of every backend that grants (docs/algorithm.md,
"One-write hand-over"): the heartbeat a request was heard at, how a standby stands as a
member a release may grant to, and waiting for a grant."""

from __future__ import annotations

import asyncio
import datetime as dt

from leaderd.backends import Backend, Candidate
from leaderd.backends.base import Grant, Lease
from tests.support.backend_calls import ask


def heard(lease: Lease, who: Candidate) -> dt.datetime:
    """When the request that answered ``lease`` was heard from ``who`` (backend clock)."""
    me = (who.node_id, who.instance)
    member = next(m for m in lease.members if (m.node_id, m.instance) == me)
    assert member.heard_at is not None
    return member.heard_at


async def stand_by_asking(
    backend: Backend, election: str, who: Candidate, ttl: float
) -> dt.datetime:
    """SQL backends: one follower round makes ``who`` a campaigning member. Its heartbeat,
    which a grant to it counts from."""
    return heard(await ask(backend, election, who, ttl=ttl, timeout=5), who)


async def stand_with_a_spare(
    backend: Backend, election: str, who: Candidate, ttl: float
) -> dt.datetime:
    """etcd: two follower rounds, the first grants a spare, the second offers it. The
    heartbeat of the first, which the spare's expiry counts from."""
    first = await stand_by_asking(backend, election, who, ttl)
    await ask(backend, election, who, ttl=ttl, timeout=5)
    return first


async def wait_grant(backend: Backend, election: str) -> Grant:
    """The grant ``backend``'s waiter is told of, within 3 s."""
    async with asyncio.timeout(3):
        while True:
            grant = await backend.wait_for_change(election, 1.0)
            if grant is not None:
                return grant
