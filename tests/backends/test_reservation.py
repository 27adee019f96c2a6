"""The hand-over contract (leaderd/backends/base.py): a release that reserves the free lease
for one node id for one ttl, run unchanged against every backend that can hand over.

Each instance from ``store.new()`` stands for a separate daemon on the same store.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from leaderd.backends import Backend, Candidate, Lease
from leaderd.backends.base import Capability
from tests.support.backend_calls import ask, release

from .conftest import LONG_TTL, SHORT_TTL, Store
from .test_contract import TIMEOUT, TWIN, WAIT, A, B, C, E, acquire, held, wait_in_background

LAPSE_LIMIT = 15.0  # etcd rounds a lease up to whole seconds and its minimum ttl


@pytest.fixture
def handing(store: Store) -> Store:
    store.require(Capability.RESERVES)
    return store


async def reserved(store: Store, to: Candidate, ttl: float = LONG_TTL) -> tuple[Backend, Lease]:
    """A held the lease, then released it reserved for ``to``: (A's instance, A's lease)."""
    a = await store.new()
    mine = await held(a, A)
    await release(a, E, A, mine.term, reserve_for=to.node_id, ttl=ttl)
    return a, mine


async def test_only_the_named_node_takes_a_reserved_lease_with_the_next_term(
    handing: Store,
) -> None:
    a, mine = await reserved(handing, C)
    b, c = await handing.new(), await handing.new()
    seen = await b.observe(E)
    assert (seen.holder, seen.term, seen.reserved_for) == (None, mine.term, C.node_id)
    assert 0 < seen.reserved_in <= LONG_TTL and seen.reserved_against(B)
    assert not seen.reserved_against(C)
    # Neither a third node nor the old holder may take it while it is reserved.
    for backend, candidate in ((b, B), (a, A)):
        refused = await acquire(backend, candidate)
        assert not refused.held_by(candidate) and refused.holder is None, refused
        assert refused.reserved_for == C.node_id
    theirs = await held(c, C)
    assert theirs.term == mine.term + 1
    # The acquisition ended the reservation: the lease is C's, reserved for nobody.
    after = await b.observe(E)
    assert (after.holder, after.term, after.reserved_for) == (C.node_id, theirs.term, "")


async def test_of_eight_concurrent_contenders_only_the_named_one_wins(handing: Store) -> None:
    _, mine = await reserved(handing, Candidate("node-5"))
    backends = [await handing.new() for _ in range(8)]
    candidates = [Candidate(f"node-{i}", f"10.0.0.{i}:8080") for i in range(8)]
    # As a follower's engine asks: a lock backend may block for the lock meanwhile (the
    # others, granted it first, give it back at once).
    asks = (
        ask(backend, E, c, LONG_TTL, timeout=TIMEOUT, wait=TIMEOUT / 2)
        for backend, c in zip(backends, candidates, strict=True)
    )
    results = await asyncio.gather(*asks)
    winners = [c.node_id for c, lease in zip(candidates, results, strict=True) if lease.held_by(c)]
    assert winners == ["node-5"], results
    assert (await backends[0].observe(E)).term == mine.term + 1


async def test_a_reservation_lapses_after_its_ttl_and_then_anyone_may_acquire(
    handing: Store,
) -> None:
    # B's session and its acquisition are ready before the reservation begins (refused while
    # A holds): the reservation lasts one short ttl, which opening them on a loaded machine
    # took longer than.
    a, b = await handing.new(), await handing.new()
    mine = await held(a, A)
    assert not (await acquire(b, B)).held_by(B)
    began = time.monotonic()  # before the release: the reservation's ttl lies after it
    await release(a, E, A, mine.term, reserve_for=C.node_id, ttl=SHORT_TTL)
    first = await acquire(b, B)
    if time.monotonic() - began < SHORT_TTL:  # so the reservation surely still held
        assert not first.held_by(B)  # reserved for C, who never comes
    async with asyncio.timeout(LAPSE_LIMIT):
        while not (lease := await acquire(b, B)).held_by(B):
            assert lease.holder is None and lease.reserved_for == C.node_id, lease
            await b.wait_for_change(E, min(lease.reserved_in, SHORT_TTL) + 0.05)
    assert lease.term == mine.term + 1 and lease.reserved_for == ""


async def test_the_reservation_names_a_node_id_so_any_of_its_processes_may_take_it(
    handing: Store,
) -> None:
    # node-a's release reserved for node-b; node-b restarted meanwhile (another instance).
    a = await handing.new()
    mine = await held(a, A)
    await release(a, E, A, mine.term, reserve_for=B.node_id, ttl=LONG_TTL)
    restarted_b = Candidate(B.node_id, B.address)
    assert (await held(await handing.new(), restarted_b)).term == mine.term + 1


async def test_a_release_by_a_non_holder_reserves_nothing(handing: Store) -> None:
    a, b = await handing.new(), await handing.new()
    mine = await held(a, A)
    await release(b, E, B, mine.term, reserve_for=B.node_id, ttl=LONG_TTL)
    await release(b, E, TWIN, mine.term, reserve_for=B.node_id, ttl=LONG_TTL)
    seen = await b.observe(E)
    assert (seen.holder, seen.term, seen.reserved_for) == (A.node_id, mine.term, "")
    assert (await held(a, A)).term == mine.term  # still A's: a renewal


async def test_a_plain_release_after_a_hand_over_reserves_nothing(handing: Store) -> None:
    await reserved(handing, C)
    c, b = await handing.new(), await handing.new()
    theirs = await held(c, C)
    await release(c, E, C, theirs.term)
    assert (await held(b, B)).term == theirs.term + 1


async def test_the_named_node_is_woken_promptly_by_the_reserving_release(
    handing: Store,
) -> None:
    a, c = await handing.new(), await handing.new()
    mine = await held(a, A)
    await c.observe(E)
    task = await wait_in_background(c, WAIT)
    released = time.monotonic()
    await release(a, E, A, mine.term, reserve_for=C.node_id, ttl=LONG_TTL)
    woke = await asyncio.wait_for(task, WAIT * 2)
    assert woke - released < WAIT / 2, "woke by its timeout, not by the release"
    lease = await ask(c, E, C, LONG_TTL, timeout=TIMEOUT)
    assert lease.held_by(C) and lease.term == mine.term + 1
