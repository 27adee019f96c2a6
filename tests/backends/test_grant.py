"""The one-write hand-over (docs/algorithm.md, "One-write hand-over" and "Who inherits a
granted lease"), run unchanged against every backend that GRANTS.

A release that grants hands the lease, in its own write, to the freshest campaigning member
of another node id heard within half of its own ttl (leaderd/election/heir.py), with the
next term; the heir's waiting read is told with the heartbeat its expiry counts from. How a
standby stands as such a member is its backend's (``store.stand``, conftest.py). The leader
renews after the members change, as it does every renew interval: its renewal is where a
backend that chooses in its own process (etcd) reads them.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from leaderd.backends import Backend, Candidate, Lease
from leaderd.backends.base import Capability
from tests.support.backend_calls import ask, release
from tests.support.grants import wait_grant

from .conftest import LONG_TTL, Store
from .test_contract import TWIN, A, B, C, E, held

TTL = 4.0  # of every member and lease unless a test says otherwise


@pytest.fixture
def granting(store: Store) -> Store:
    store.require(Capability.GRANTS)
    return store


async def leading(store: Store, ttl: float = TTL) -> tuple[Backend, Lease]:
    """A holds the lease: (A's instance, A's lease)."""
    a = await store.new()
    return a, await held(a, A, ttl)


async def renew(a: Backend, ttl: float = TTL) -> Lease:
    """A's renewal, which reads the members a release of it chooses from."""
    return await held(a, A, ttl)


async def stand_in_turn(
    store: Store, a: Backend, *standbys: tuple[Backend, Candidate]
) -> dt.datetime:
    """Each standby stands in turn, 0.2 s apart, A renewing after each: the last is the
    freshest. Its heartbeat, which a grant to it counts from."""
    heartbeats = []
    for backend, who in standbys:
        await asyncio.sleep(0.2 if heartbeats else 0.0)
        heartbeats.append(await store.stand(backend, E, who, TTL))
        await renew(a)
    return heartbeats[-1]


async def told_no_grant_of_its_own(backend: Backend, who: Candidate) -> None:
    """``who``'s waiter, not the heir, is told no grant (Backend.wait_for_change: only the
    process the release handed the lease to; postgresql:// hears every grant's NOTIFY)."""
    grant = await backend.wait_for_change(E, 0.2)
    assert grant is None, f"{who.node_id} was told of a grant to {grant.lease.holder}"


async def test_a_release_grants_the_freshest_standby_the_next_term(granting: Store) -> None:
    a, mine = await leading(granting)
    b, c = await granting.new(), await granting.new()
    # C, the freshest: B would win a tie (node-b sorts first), so C wins by freshness only.
    c_heard = await stand_in_turn(granting, a, (b, B), (c, C))
    waiting = asyncio.ensure_future(wait_grant(c, E))
    await asyncio.sleep(0.1)  # C's waiter is blocked when the release lands
    await release(a, E, A, mine.term, grant=True)
    grant = await waiting
    assert grant.heard_at == c_heard and grant.lease.held_by(C)
    assert grant.lease.term == mine.term + 1 and grant.lease.expires_in == TTL
    seen = await b.observe(E)
    assert seen.holder == C.node_id and seen.term == mine.term + 1
    step = granting.entry.ttl_left_step
    assert seen.expires_in is not None and TTL - 1.0 - step < seen.expires_in <= TTL
    if Capability.TAKEOVER in a.capabilities:
        assert seen.version == grant.lease.version  # what watchers time a takeover by
    # B, campaigning, cannot take it; C's own renewal keeps the granted term; told once.
    assert not (await ask(b, E, B, ttl=TTL, timeout=5)).held_by(B)
    renewed = await ask(c, E, C, ttl=TTL, timeout=5)
    assert renewed.held_by(C) and renewed.term == grant.lease.term
    assert await c.wait_for_change(E, 0.3) is None
    records = await b.history(E, 10)
    assert [(r.term, r.holder, r.end_reason) for r in records] == [
        (mine.term + 1, C.node_id, None),
        (mine.term, A.node_id, "released"),
    ]


async def test_the_granted_lease_expires_its_ttl_after_the_heirs_heartbeat(
    granting: Store,
) -> None:
    granting.require(Capability.TTL_LEFT)
    ttl = 2 * TTL  # B stays heard within half of it while its heartbeat ages
    a, mine = await leading(granting, ttl)
    b = await granting.new()
    b_heard = await granting.stand(b, E, B, ttl)
    await renew(a, ttl)
    aged = 1.0 + granting.entry.ttl_left_step  # more than expires_in is rounded by
    await asyncio.sleep(aged)  # B's heartbeat ages; the grant must not restart its ttl
    await release(a, E, A, mine.term, grant=True)
    seen = await a.observe(E)
    assert seen.holder == B.node_id
    assert seen.expires_in is not None and seen.expires_in <= ttl - aged
    assert (await wait_grant(b, E)).heard_at == b_heard


async def test_no_grant_to_the_releasers_node_id_in_another_process(granting: Store) -> None:
    a, mine = await leading(granting)
    b, twin = await granting.new(), await granting.new()
    await stand_in_turn(granting, a, (b, B), (twin, TWIN))  # the freshest, but of node-a
    await release(a, E, A, mine.term, grant=True)
    grant = await wait_grant(b, E)
    assert grant.lease.held_by(B) and grant.lease.term == mine.term + 1
    await told_no_grant_of_its_own(twin, TWIN)


async def test_no_grant_to_a_member_cooling_down(granting: Store) -> None:
    a, mine = await leading(granting)
    b, c = await granting.new(), await granting.new()
    await stand_in_turn(granting, a, (c, C), (b, B))
    await b.observe(E, B, TTL)  # then cooling down: the freshest heard, not campaigning
    await renew(a)
    await release(a, E, A, mine.term, grant=True)
    grant = await wait_grant(c, E)
    assert grant.lease.held_by(C) and grant.lease.term == mine.term + 1
    await told_no_grant_of_its_own(b, B)


async def test_no_grant_to_a_stale_member_so_none_eligible_means_a_plain_release(
    granting: Store,
) -> None:
    """C is silent for over half its own ttl (its spare, on etcd, still alive); B cools
    down and A's twin campaigns, both heard since: none may inherit."""
    a, mine = await leading(granting, ttl=LONG_TTL)
    b, c, twin = await granting.new(), await granting.new(), await granting.new()
    stale_ttl = granting.entry.stale_ttl
    await granting.stand(c, E, C, stale_ttl)
    await renew(a, LONG_TTL)
    await asyncio.sleep(stale_ttl * 0.6)
    await granting.stand(b, E, B, TTL)
    await b.observe(E, B, TTL)  # cooling down: heard, not campaigning
    await granting.stand(twin, E, TWIN, TTL)
    silent = next(m for m in (await renew(a, LONG_TTL)).members if m.node_id == C.node_id)
    assert silent.heard_ago >= stale_ttl / 2  # stale, as the leader's release judges it
    await release(a, E, A, mine.term, grant=True)
    released = await b.observe(E)
    assert released.holder is None and released.term == mine.term
    for standby in (b, c, twin):
        assert await standby.wait_for_change(E, 0.2) is None


async def test_with_no_member_a_granting_release_is_a_plain_release(granting: Store) -> None:
    a, mine = await leading(granting)
    await release(a, E, A, mine.term, grant=True)
    seen = await (await granting.new()).observe(E)
    assert seen.holder is None and seen.term == mine.term
    assert (await held(a, A, TTL)).term == mine.term + 1


async def test_a_release_without_grant_grants_nothing(granting: Store) -> None:
    a, mine = await leading(granting)
    b = await granting.new()
    await stand_in_turn(granting, a, (b, B))
    await release(a, E, A, mine.term)
    assert (await b.observe(E)).holder is None
    assert await b.wait_for_change(E, 0.2) is None


async def test_a_reservation_overrides_the_heir(granting: Store) -> None:
    a, mine = await leading(granting)
    b = await granting.new()
    await stand_in_turn(granting, a, (b, B))
    await release(a, E, A, mine.term, reserve_for=C.node_id, ttl=TTL, grant=True)
    reserved = await b.observe(E)
    assert reserved.holder is None and reserved.reserved_for == C.node_id
    assert await b.wait_for_change(E, 0.2) is None


async def test_a_stale_holder_grants_nothing(granting: Store) -> None:
    """A release names its term: a holder that lost the lease cannot give away its heir's."""
    a, mine = await leading(granting)
    b, c = await granting.new(), await granting.new()
    await stand_in_turn(granting, a, (b, B))
    await release(a, E, A, mine.term, grant=True)  # B now holds mine.term + 1
    assert (await wait_grant(b, E)).lease.held_by(B)
    await granting.stand(c, E, C, TTL)
    await ask(b, E, B, ttl=TTL, timeout=5)  # the new leader's renewal reads C
    await release(a, E, A, mine.term, grant=True)
    seen = await c.observe(E)
    assert seen.holder == B.node_id and seen.term == mine.term + 1


async def test_a_release_that_lands_after_a_renewal_grants_nothing(granting: Store) -> None:
    """A grant names the version last answered: one held until after the next renewal of
    the same term matches nothing (docs/algorithm.md, "A release in doubt")."""
    granting.require(Capability.VERSIONED_RELEASE)
    a, first = await leading(granting)
    b = await granting.new()
    await granting.stand(b, E, B, TTL)
    renewed = await renew(a)
    assert renewed.term == first.term and renewed.version != first.version
    await release(a, E, A, first.term, grant=True, version=first.version)
    seen = await b.observe(E)
    assert seen.held_by(A) and seen.term == first.term, seen
    await release(a, E, A, first.term, grant=True, version=renewed.version)
    assert (await wait_grant(b, E)).lease.term == first.term + 1


async def test_a_granted_lease_is_released_as_any_and_terms_go_on(granting: Store) -> None:
    a, mine = await leading(granting)
    b = await granting.new()
    await stand_in_turn(granting, a, (b, B))
    await release(a, E, A, mine.term, grant=True)
    grant = await wait_grant(b, E)
    await release(b, E, B, grant.lease.term)
    again = await ask(a, E, A, ttl=TTL, timeout=5, min_term=grant.lease.term + 1)
    assert again.held_by(A) and again.term == grant.lease.term + 1


async def test_a_leader_that_released_is_not_granted_the_lease_back(granting: Store) -> None:
    """A's renewals said it campaigned; once it released (stopping), the heir's own
    release must not hand the lease back to it (the podman stop of both containers)."""
    a, mine = await leading(granting)
    b = await granting.new()
    await stand_in_turn(granting, a, (b, B))
    await release(a, E, A, mine.term, grant=True)
    assert (await wait_grant(b, E)).lease.term == mine.term + 1
    await release(b, E, B, mine.term + 1, grant=True)
    seen = await b.observe(E)
    assert seen.holder is None and seen.term == mine.term + 1
    await told_no_grant_of_its_own(a, A)
