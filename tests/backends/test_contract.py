"""The backend contract (leaderd/backends/base.py), run unchanged against every backend.

Each instance from ``store.new()`` stands for a separate daemon on the same store.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time

from leaderd.backends import Backend, Candidate, Lease
from leaderd.backends.base import Capability
from tests.support.backend_calls import ask, release

from .conftest import LONG_TTL, SHORT_TTL, Store

E = "default"
A = Candidate("node-a", "10.0.0.1:8080")
B = Candidate("node-b", "10.0.0.2:8080")
C = Candidate("node-c", "10.0.0.3:8080")
TWIN = Candidate("node-a", "10.0.0.9:8080")  # node-a's id in another process
TIMEOUT = 10.0  # per request; generous for a loaded machine
WAIT = 5.0  # wait_for_change timeout that a prompt wake-up must beat by far


async def acquire(
    backend: Backend, candidate: Candidate, ttl: float = LONG_TTL, takeover: str = ""
) -> Lease:
    return await ask(backend, E, candidate, ttl, timeout=TIMEOUT, takeover=takeover)


async def take_over(backend: Backend, candidate: Candidate) -> Lease:
    """Acquire an expired lease as the engine does: naming the version it watched."""
    seen = await backend.observe(E)
    assert seen.holder is None or seen.expired, seen
    lease = await acquire(backend, candidate, takeover=seen.version)
    assert lease.held_by(candidate), lease
    return lease


async def held(backend: Backend, candidate: Candidate, ttl: float = LONG_TTL) -> Lease:
    lease = await acquire(backend, candidate, ttl)
    assert lease.held_by(candidate), lease
    return lease


async def test_a_new_election_is_free(store: Store) -> None:
    lease = await (await store.new()).observe(E)
    # Term 0, or a new SQLite file's seed (docs/sqlite.md): a file never restarts terms.
    assert (lease.holder, lease.address) == (None, "") and lease.term >= 0
    assert lease.acquired_at is None and lease.expires_in is None


async def test_exactly_one_of_eight_concurrent_contenders_wins(store: Store) -> None:
    backends = [await store.new() for _ in range(8)]
    candidates = [Candidate(f"node-{i}", f"10.0.0.{i}:8080") for i in range(8)]
    before = await backends[0].observe(E)
    results = await asyncio.gather(
        *(acquire(backend, c) for backend, c in zip(backends, candidates, strict=True))
    )
    winners = [c for c, lease in zip(candidates, results, strict=True) if lease.held_by(c)]
    assert len(winners) == 1, results
    winner = winners[0]
    assert {(r.holder, r.term) for r in results} == {(winner.node_id, before.term + 1)}
    seen = await (await store.new()).observe(E)
    assert (seen.holder, seen.address) == (winner.node_id, winner.address)
    assert seen.term == before.term + 1


async def test_observe_returns_the_holder(store: Store) -> None:
    a, b = await store.new(), await store.new()
    mine = await held(a, A)
    seen = await b.observe(E)
    assert seen.held_by(A) and not seen.held_by(B)
    assert (seen.holder, seen.address, seen.term) == (A.node_id, A.address, mine.term)
    assert isinstance(seen.acquired_at, dt.datetime) and seen.acquired_at.tzinfo is not None
    assert abs(seen.acquired_at - dt.datetime.now(dt.UTC)) < dt.timedelta(seconds=30)


async def test_renew_keeps_the_term(store: Store) -> None:
    a = await store.new()
    first = await held(a, A)
    for _ in range(3):
        again = await held(a, A)
        assert (again.term, again.acquired_at) == (first.term, first.acquired_at)


async def test_expires_in_is_the_backends_view_of_time_left(store: Store) -> None:
    store.require(Capability.TTL_LEFT)
    a, b = await store.new(), await store.new()
    mine = await held(a, A, ttl=30.0)
    assert mine.expires_in is not None and 25.0 < mine.expires_in <= 30.0
    seen = await b.observe(E)
    assert seen.expires_in is not None and 25.0 < seen.expires_in <= mine.expires_in


async def test_a_non_holder_cannot_renew_or_release(store: Store) -> None:
    a, b = await store.new(), await store.new()
    mine = await held(a, A)
    theirs = await acquire(b, B)
    assert not theirs.held_by(B)
    assert (theirs.holder, theirs.term) == (A.node_id, mine.term)
    await release(b, E, B, mine.term)
    await release(a, E, A, mine.term + 1)  # the holder, but not with its term
    seen = await b.observe(E)
    assert (seen.holder, seen.term) == (A.node_id, mine.term)


async def test_release_lets_another_acquire_at_once_with_the_next_term(store: Store) -> None:
    a, b = await store.new(), await store.new()
    mine = await held(a, A)
    await release(a, E, A, mine.term)
    seen = await (await store.new()).observe(E)
    assert (seen.holder, seen.address, seen.term) == (None, "", mine.term)  # term kept
    theirs = await held(b, B)
    assert theirs.term == mine.term + 1


async def test_a_release_that_lands_after_a_renewal_changes_nothing(store: Store) -> None:
    """A release, grant or reservation names the version last answered: one held until
    after the next renewal of the same term matches nothing (docs/algorithm.md)."""
    store.require(Capability.VERSIONED_RELEASE)
    a, b = await store.new(), await store.new()
    first = await held(a, A)
    await acquire(b, B)  # a live campaigning member a grant would pick
    renewed = await held(a, A)
    assert renewed.term == first.term and renewed.version != first.version
    await release(a, E, A, first.term, grant=True, version=first.version)
    await release(a, E, A, first.term, reserve_for=B.node_id, ttl=LONG_TTL, version=first.version)
    seen = await b.observe(E)
    assert seen.held_by(A) and (seen.term, seen.reserved_for) == (first.term, ""), seen
    await release(a, E, A, first.term, version=renewed.version)
    assert (await b.observe(E)).holder is None


async def test_the_same_holder_gets_the_next_term_after_release(store: Store) -> None:
    a = await store.new()
    first = await held(a, A)
    await release(a, E, A, first.term)
    assert (await held(a, A)).term == first.term + 1


async def test_expiry_lets_another_take_over_with_the_next_term(store: Store) -> None:
    a, b = await store.new(), await store.new()
    mine = await held(a, A, ttl=SHORT_TTL)
    await store.expire(a, E)
    seen = await b.observe(E)
    assert seen.term == mine.term and not seen.held_by(A)
    assert seen.holder is None or (seen.expired and seen.holder == A.node_id)
    assert (await take_over(b, B)).term == mine.term + 1


async def test_the_same_holder_gets_the_next_term_after_expiry(store: Store) -> None:
    a = await store.new()
    mine = await held(a, A, ttl=SHORT_TTL)
    a = await store.expire(a, E)
    assert (await take_over(a, A)).term == mine.term + 1


async def test_an_expired_lease_is_taken_over_only_by_naming_its_version(store: Store) -> None:
    store.require(Capability.TAKEOVER)
    a, b = await store.new(), await store.new()
    mine = await held(a, A, ttl=SHORT_TTL)
    await store.expire(a, E)
    seen = await b.observe(E)
    assert seen.expired and seen.holder == A.node_id and seen.version
    for version in ("", seen.version + "0", "stale"):
        refused = await acquire(b, B, takeover=version)
        assert not refused.held_by(B) and refused.term == mine.term, version
    assert (await acquire(b, B, takeover=seen.version)).held_by(B)


async def test_a_renewal_changes_the_version_so_a_watched_one_goes_stale(store: Store) -> None:
    store.require(Capability.TAKEOVER)
    a, b = await store.new(), await store.new()
    await held(a, A, ttl=SHORT_TTL)
    watched = (await b.observe(E)).version
    renewed = await held(a, A, ttl=SHORT_TTL)
    assert renewed.version != watched
    await store.expire(a, E)
    assert not (await acquire(b, B, takeover=watched)).held_by(B)


async def test_the_same_node_id_in_another_process_is_another_holder(store: Store) -> None:
    a, twin = await store.new(), await store.new()
    mine = await held(a, A)
    theirs = await acquire(twin, TWIN)
    assert not theirs.held_by(TWIN) and theirs.held_by_twin(TWIN), theirs
    assert (theirs.holder, theirs.instance, theirs.term) == (A.node_id, A.instance, mine.term)
    await release(twin, E, TWIN, mine.term)  # not the holder: a no-op
    assert (await a.observe(E)).held_by(A)
    assert (await held(a, A)).term == mine.term


async def test_an_acquisition_takes_at_least_min_term(store: Store) -> None:
    a, b = await store.new(), await store.new()
    mine = await held(a, A)
    await release(a, E, A, mine.term)
    lease = await ask(b, E, B, LONG_TTL, TIMEOUT, min_term=mine.term + 10)
    assert lease.held_by(B) and lease.term == mine.term + 10
    renewed = await ask(b, E, B, LONG_TTL, TIMEOUT, min_term=mine.term + 20)
    assert renewed.term == mine.term + 10  # a renewal keeps its term


async def test_terms_survive_release_and_restart(store: Store) -> None:
    store.require(Capability.DURABLE)
    a, b = await store.new(), await store.new()
    first = await held(a, A)
    await release(a, E, A, first.term)
    second = await held(b, B)
    await release(b, E, B, second.term)
    await store.restart()
    c = await store.new()
    seen = await c.observe(E)
    assert (seen.holder, seen.term) == (None, second.term)
    third = await held(c, C)
    assert first.term < second.term < third.term


async def test_terms_never_decrease_when_the_holder_restarts(store: Store) -> None:
    store.require(Capability.DURABLE)
    mine = await held(await store.new(), A)
    await store.restart()
    a = await store.new()
    assert (await a.observe(E)).term >= mine.term
    assert (await held(a, A)).term >= mine.term  # renewed (still live) or taken anew


async def test_elections_are_independent(store: Store) -> None:
    a, b = await store.new(), await store.new()
    await held(a, A)
    other = await ask(b, "other", B, LONG_TTL, timeout=TIMEOUT)
    assert other.held_by(B) and other.election == "other"


async def wait_in_background(backend: Backend, timeout: float) -> asyncio.Task[float]:
    """Start ``wait_for_change`` and return a task giving the monotonic time it returned."""

    async def wait() -> float:
        await backend.wait_for_change(E, timeout)
        return time.monotonic()

    task = asyncio.create_task(wait())
    await asyncio.sleep(0.2)  # let it settle into waiting
    assert not task.done(), "wait_for_change returned although nothing changed"
    return task


async def test_wait_for_change_wakes_promptly_on_release(store: Store) -> None:
    a, b = await store.new(), await store.new()
    mine = await held(a, A)
    await b.observe(E)
    task = await wait_in_background(b, WAIT)
    released = time.monotonic()
    await release(a, E, A, mine.term)
    woke = await asyncio.wait_for(task, WAIT * 2)
    assert woke - released < WAIT / 2, "woke by its timeout, not by the release"
    assert (await b.observe(E)).holder is None


async def test_wait_for_change_wakes_promptly_on_acquisition(store: Store) -> None:
    a, b = await store.new(), await store.new()
    await b.observe(E)
    task = await wait_in_background(b, WAIT)
    acquired = time.monotonic()
    await held(a, A)
    woke = await asyncio.wait_for(task, WAIT * 2)
    assert woke - acquired < WAIT / 2, "woke by its timeout, not by the acquisition"


async def test_wait_for_change_returns_after_its_timeout_when_nothing_changes(
    store: Store,
) -> None:
    a, b = await store.new(), await store.new()
    await held(a, A)
    await b.observe(E)
    started = time.monotonic()
    await asyncio.wait_for(b.wait_for_change(E, 0.5), WAIT)
    assert time.monotonic() - started >= 0.45


async def test_close_is_idempotent(store: Store) -> None:
    a = await store.new()
    await a.close()
    await a.close()
