"""Only a request's own answer makes a leader (docs/algorithm.md): a heartbeat written by a
round whose answer never came, then listed again by an answer served from a cache (an etcd
watch event), is not filed under that later round's send time; a grant naming it is checked
with a round instead of led on. On the fake clock, so every deadline is exact."""

from __future__ import annotations

import dataclasses

from leaderd.backends.base import Grant
from leaderd.election.engine import Election

from .clocks import FakeClock
from .fakes import LeaseStore, RecordingBackend
from .world import TIMING, A, B, C

E = "default"


def standby() -> tuple[Election, RecordingBackend, LeaseStore, FakeClock]:
    clock = FakeClock()
    store = LeaseStore(clock)
    store.take(E, A, TIMING.ttl)
    backend = RecordingBackend(store, granting=True)
    return Election(E, B, TIMING, backend, clock=clock, jitter=lambda: 0.0), backend, store, clock


def grant_naming(store: LeaseStore, heard_at_s: float) -> Grant:
    """The release of C's term handing the lease to B, counting from B's heartbeat heard at
    ``heard_at_s`` on the clock: it expires one ttl after that heartbeat."""
    row = store.rows[E]
    row.holder, row.instance, row.term = B.node_id, B.instance, row.term + 1
    row.expires_at = heard_at_s + TIMING.ttl
    # base.Grant: the lease lasts expires_in after the request that wrote that heartbeat.
    lease = dataclasses.replace(store.lease(E), expires_in=TIMING.ttl)
    return Grant(lease, store.heard[B.node_id, B.instance][0])


async def test_a_grant_naming_a_failed_rounds_heartbeat_makes_no_leader() -> None:
    b, backend, store, clock = standby()
    await b.round()  # answered: its heartbeat counts from its own send time
    clock.advance(1.0)
    failed_at = clock.now()
    backend.script.heard_then_lost = True
    await b.round()  # heard by the backend (a spare kept alive), then the round failed
    assert b.state.maybe_held
    clock.advance(2.0)
    store.release(E, A, store.lease(E).term)
    store.take(E, C, TIMING.ttl)  # the watch event names a new holder...
    backend.script.cached = True
    await b.round()  # ...and this round answers from the cache: no request
    assert b.status().leader is not None and b.status().leader.node_id == C.node_id
    grant = grant_naming(store, failed_at)  # C's SIGTERM grants B from that heartbeat
    clock.advance(0.1)
    b._take_grant(grant)
    clock.advance(failed_at + TIMING.ttl - clock.now())  # the backend's expiry of the lease
    assert not b.status().is_leader  # it must not lead on the grant: only a round can tell
    assert b._heartbeats.sent_at(grant.heard_at) is None
    assert b.state.maybe_held  # a cache cannot tell what the lost answer said


async def test_a_cached_answer_showing_our_lease_neither_starts_nor_extends_a_hold() -> None:
    b, backend, store, clock = standby()
    store.release(E, A, store.lease(E).term)
    await b.round()
    assert b.status().is_leader
    deadline = b.state.deadline
    clock.advance(TIMING.renew_interval)
    backend.script.cached = True
    await b.round()
    assert b.state.deadline == deadline  # no request of its own: no later deadline
    clock.advance(deadline - clock.now())
    assert not b.status().is_leader
    fresh, fresh_backend, fresh_store, _ = standby()
    fresh_store.release(E, A, fresh_store.lease(E).term)
    fresh_store.take(E, B, TIMING.ttl)  # ours by a grant it never heard of
    fresh_backend.script.cached = True
    await fresh.round()
    assert not fresh.status().is_leader and fresh.state.held_term is None


async def test_a_rounds_own_heartbeat_is_filed_under_its_send_time() -> None:
    b, _, store, clock = standby()
    clock.advance(0.5)
    sent = clock.now()
    await b.round()
    heard = store.heard[B.node_id, B.instance][0]
    assert b._heartbeats.sent_at(heard) == sent
    clock.advance(0.1)
    assert b._take_grant(grant_naming(store, sent)) is not None
    assert b.status().is_leader and b.state.deadline <= sent + TIMING.lease_window
