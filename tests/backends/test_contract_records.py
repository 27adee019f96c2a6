"""The members and history contract (leaderd/backends/base.py, records.py), run unchanged
against every backend. Each instance from ``store.new()`` stands for a separate daemon."""

from __future__ import annotations

import asyncio

from leaderd import __version__
from leaderd.backends import Backend, Candidate, Lease
from leaderd.backends.base import Capability
from leaderd.backends.records import (
    HISTORY_RETENTION,
    LEFT_TTL,
    PRUNE_AFTER_TTLS,
    EndReason,
    Member,
)
from tests.support.backend_calls import ask, release

from .conftest import LONG_TTL, SHORT_TTL, Store
from .test_contract import TIMEOUT, TWIN, A, B, C, E, acquire, held, take_over


def listed(lease: Lease) -> dict[tuple[str, str], Member]:
    return {(m.node_id, m.instance): m for m in lease.members}


async def follow(backend: Backend, candidate: Candidate, ttl: float = LONG_TTL) -> Lease:
    """A follower's round: an acquire-or-renew that does not win."""
    lease = await acquire(backend, candidate, ttl)
    assert not lease.held_by(candidate), lease
    return lease


async def test_every_request_registers_its_candidate_as_a_member(store: Store) -> None:
    a, b, c = await store.new(), await store.new(), await store.new()
    await held(a, A)
    await follow(b, B)
    seen = await c.observe(E, C, LONG_TTL)  # a cooling-down node stays listed
    members = listed(seen)
    assert set(members) == {(x.node_id, x.instance) for x in (A, B, C)}
    for who in (A, B, C):
        member = members[who.node_id, who.instance]
        assert (member.address, member.version, member.ttl) == (who.address, __version__, LONG_TTL)
        assert 0 <= member.heard_ago < 30 and member.heard_at is not None
    # An observe that names nobody registers nobody, and still lists them.
    assert set(listed(await (await store.new()).observe(E))) == set(members)


async def test_each_answer_names_the_heartbeat_its_own_request_wrote(store: Store) -> None:
    """Only a request's own answer makes a leader (docs/algorithm.md): the engine files a
    heartbeat only from ``Lease.heartbeat``, so each answer names the one it wrote."""
    a, b = await store.new(), await store.new()
    answers = [(await acquire(a, A), A), (await follow(b, B), B),
               (await b.observe(E, B, LONG_TTL), B), (await acquire(a, A), A),
               (await follow(b, B), B)]  # fmt: skip
    for lease, who in answers:
        assert not lease.cached and lease.heartbeat is not None
        assert listed(lease)[who.node_id, who.instance].heard_at == lease.heartbeat
    assert (await b.observe(E)).heartbeat is None  # a read that names nobody writes none


async def test_a_node_id_in_two_processes_is_two_members(store: Store) -> None:
    a, twin = await store.new(), await store.new()
    await held(a, A)
    lease = await follow(twin, TWIN)
    assert [m.instance for m in lease.members if m.node_id == A.node_id] == sorted(
        [A.instance, TWIN.instance]
    )


async def test_a_silent_member_ages_past_its_ttl_and_is_pruned(store: Store) -> None:
    store.require(Capability.EXPIRES)  # static: one process, nobody else to fall silent
    a, b = await store.new(), await store.new()
    await held(a, A)
    await follow(b, B, ttl=SHORT_TTL)
    assert listed(await acquire(a, A))[B.node_id, B.instance].heard_ago < SHORT_TTL
    await asyncio.sleep(SHORT_TTL * 1.5)
    assert listed(await acquire(a, A))[B.node_id, B.instance].heard_ago >= SHORT_TTL
    await asyncio.sleep(SHORT_TTL * PRUNE_AFTER_TTLS)
    await acquire(a, A)  # the request that prunes it
    assert set(listed(await acquire(a, A))) == {(A.node_id, A.instance)}


async def test_a_member_heard_with_ttl_0_is_stale_at_once_and_pruned(store: Store) -> None:
    """A stopping daemon's last heartbeat (LEFT_TTL): no member list shows it live after."""
    store.require(Capability.EXPIRES)  # static: one process, it cannot leave while another looks
    a, b = await store.new(), await store.new()
    await held(a, A)
    await follow(b, B)
    await b.observe(E, B, LEFT_TTL)
    left = listed(await a.observe(E)).get((B.node_id, B.instance))  # etcd prunes it at once
    assert left is None or (left.ttl == LEFT_TTL and left.heard_ago >= left.ttl), left
    await acquire(a, A)  # the request that prunes it
    assert set(listed(await acquire(a, A))) == {(A.node_id, A.instance)}


async def test_history_names_the_standby_a_switchover_went_to(store: Store) -> None:
    store.require(Capability.RESERVES)
    a, b = await store.new(), await store.new()
    first = await held(a, A)
    await release(a, E, A, first.term, EndReason.RESIGNED, reserve_for=B.node_id, ttl=LONG_TTL)
    second = await held(b, B)
    assert reasons(await a.history(E, 10)) == [
        (second.term, B.node_id, None),
        (first.term, A.node_id, f"handed over to {B.node_id}"),
    ]


def reasons(records: list[object]) -> list[tuple[int, str, str | None]]:
    return [(r.term, r.holder, r.end_reason) for r in records]  # type: ignore[attr-defined]


async def test_history_records_releases_and_resignations(store: Store) -> None:
    a, b = await store.new(), await store.new()
    first = await held(a, A)
    await release(a, E, A, first.term, EndReason.RESIGNED)
    second = await held(b, B)
    assert reasons(await a.history(E, 10)) == [
        (second.term, B.node_id, None),
        (first.term, A.node_id, EndReason.RESIGNED),
    ]
    await release(b, E, B, second.term)
    records = await a.history(E, 10)
    assert reasons(records)[0] == (second.term, B.node_id, EndReason.RELEASED)
    latest = records[0]
    assert (latest.election, latest.instance, latest.address) == (E, B.instance, B.address)
    assert latest.acquired_at is not None and latest.ended_at is not None
    assert latest.acquired_at <= latest.ended_at
    assert reasons(await a.history(E, 1)) == reasons(records)[:1]
    assert await a.history("other", 10) == []


async def test_history_tells_an_expiry_from_a_takeover(store: Store) -> None:
    a, b = await store.new(), await store.new()
    first = await acquire(a, A, SHORT_TTL)
    a = await store.expire(a, E)
    again = await take_over(a, A)  # the same process, after its own lease lapsed
    await release(a, E, A, again.term)
    second = await acquire(b, B, SHORT_TTL)
    b = await store.expire(b, E)
    third = await take_over(a, A)
    # etcd's lessor deletes a lapsed key: every lapse there is "expired".
    taken = EndReason.EXPIRED if store.name == "etcd" else EndReason.TAKEN_OVER
    assert reasons(await b.history(E, 10)) == [
        (third.term, A.node_id, None),
        (second.term, B.node_id, taken),
        (again.term, A.node_id, EndReason.RELEASED),
        (first.term, A.node_id, EndReason.EXPIRED),
    ]


async def test_a_holder_that_lost_the_backend_says_so_later(store: Store) -> None:
    a, b = await store.new(), await store.new()
    first = await acquire(a, A, SHORT_TTL)
    a = await store.expire(a, E)
    await take_over(b, B)
    # A's next request names the term it stepped down from, unable to reach the backend.
    lease = await ask(a, E, A, LONG_TTL, timeout=TIMEOUT, lost_term=first.term)
    assert not lease.held_by(A)
    assert reasons(await b.history(E, 10))[1] == (
        first.term,
        A.node_id,
        EndReason.LOST_BACKEND,
    )


async def test_history_survives_a_restart(store: Store) -> None:
    a = await store.new()
    lease = await held(a, A)
    await release(a, E, A, lease.term)
    await store.restart()
    records = await (await store.new()).history(E, 10)
    assert reasons(records) == [(lease.term, A.node_id, EndReason.RELEASED)]


async def test_history_keeps_the_newest_records_past_its_retention(store: Store) -> None:
    """Each hand-over is a term. Across the bound (HISTORY_RETENTION terms) the history is
    read after every term: each new one past it drops exactly the oldest record."""
    a, b = await store.new(), await store.new()
    terms = []
    for i in range(HISTORY_RETENTION + 3):
        backend, who = (a, A) if i % 2 == 0 else (b, B)
        lease = await held(backend, who)
        await release(backend, E, who, lease.term)
        terms.append(lease.term)
        if len(terms) >= HISTORY_RETENTION - 1:
            records = await a.history(E, 10 * HISTORY_RETENTION)
            assert [r.term for r in records] == terms[::-1][:HISTORY_RETENTION]
    assert {r.end_reason for r in records} == {EndReason.RELEASED}
    assert not await a.history("other", 10)
