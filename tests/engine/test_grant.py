"""The one-write hand-over (docs/algorithm.md, "One-write hand-over"): a release grants the
lease to a standby, which leads on the grant alone, self-fencing from the very request whose
heartbeat the grant's expiry counts from."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt

import pytest

from leaderd.backends.base import Candidate, Grant, Lease
from leaderd.election.engine import Election
from leaderd.election.state import ElectionState
from leaderd.election.timing import Timing

from .clocks import RealClock
from .fakes import LeaseStore, RecordingBackend
from .world import FAST, A, B, until

# A standby that polls once a second: a hand-over within milliseconds is not its own round.
SLOW_POLL = Timing(ttl=3.0, renew_interval=1.0, retry_interval=1.0, safety_margin=0.01)


def node(store: LeaseStore, who: Candidate, timing: Timing) -> tuple[Election, RecordingBackend]:
    backend = RecordingBackend(store, granting=True)
    return Election("default", who, timing, backend, clock=RealClock(), jitter=lambda: 0.0), backend


async def leader_and_standby(
    store: LeaseStore, a_grants: bool = True
) -> tuple[Election, Election, RecordingBackend, list[asyncio.Task[None]]]:
    a, a_backend = node(store, A, FAST)
    a_backend.granting = a_grants
    b, b_backend = node(store, B, SLOW_POLL)
    tasks = [asyncio.create_task(a.run())]
    await until(lambda: a.status().is_leader)
    tasks.append(asyncio.create_task(b.run()))
    await until(lambda: b.status().leader is not None)
    return a, b, b_backend, tasks


def granted_to(who: Candidate, store: LeaseStore, term: int, heard_at: dt.datetime) -> Grant:
    """Make the store show ``who`` holding ``term`` and return the grant that says so."""
    row = store.rows["default"]
    row.holder, row.instance, row.term = who.node_id, who.instance, term
    row.expires_at = store.clock.now() + 3.0
    lease = Lease("default", who.node_id, "", term, store.clock.wall(), 3.0, instance=who.instance)
    return Grant(lease, heard_at)


async def test_a_standby_leads_on_the_grant_without_a_request_of_its_own() -> None:
    store = LeaseStore(RealClock())
    a, b, b_backend, tasks = await leader_and_standby(store)
    asked = len(b_backend.methods("acquire_or_renew"))
    a.stop()
    await until(lambda: b.status().is_leader, within=0.05)
    assert b.status().term == 2 and store.lease("default").held_by(B)
    assert len(b_backend.methods("acquire_or_renew")) == asked  # the grant was the answer
    b.stop()
    await asyncio.gather(*tasks)


async def test_the_deadline_counts_from_the_heartbeat_the_grant_names_not_a_later_one() -> None:
    store = LeaseStore(RealClock())
    a, b, b_backend, tasks = await leader_and_standby(store)
    await until(lambda: len(b._heartbeats.sent) >= 2, within=3.0)
    (older, sent_older), (_, sent_newer) = list(b._heartbeats.sent.items())[-2:]
    assert sent_older < sent_newer
    b_backend.script.grant = granted_to(B, store, 2, older)
    await until(lambda: b.status().is_leader, within=1.5)
    assert b.state.deadline == pytest.approx(sent_older + SLOW_POLL.lease_window, abs=1e-9)
    a.stop()
    b.stop()
    await asyncio.gather(*tasks)


async def test_a_grant_naming_no_answered_heartbeat_is_checked_with_a_round() -> None:
    store = LeaseStore(RealClock())
    a, b, b_backend, tasks = await leader_and_standby(store, a_grants=False)
    a.stop()
    await tasks.pop(0)
    asked = len(b_backend.methods("acquire_or_renew"))
    unknown = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    b_backend.script.grant = granted_to(B, store, 2, unknown)
    await until(lambda: b.status().is_leader, within=1.5)
    assert len(b_backend.methods("acquire_or_renew")) > asked  # led on its own renewal
    b.stop()
    await asyncio.gather(*tasks)


async def test_a_node_cooling_down_gives_a_grant_back_at_once() -> None:
    store = LeaseStore(RealClock())
    a, b, b_backend, tasks = await leader_and_standby(store, a_grants=False)
    b.resign(cooldown=10.0)  # not leading: a resign only starts the cooldown
    heard = next(iter(b._heartbeats.sent))
    b_backend.script.grant = granted_to(B, store, 5, heard)
    await until(lambda: b_backend.methods("release") != [], within=0.5)
    assert b_backend.methods("release")[0].args[:4] == ("default", "node-b", 5)
    assert not b.status().is_leader and not store.lease("default").held_by(B)
    a.stop()
    b.stop()
    await asyncio.gather(*tasks)


def test_on_grant_self_fences_from_the_send_time_it_is_given() -> None:
    state = ElectionState("default", B, FAST)
    lease = Lease("default", B.node_id, "", 3, None, FAST.ttl, instance=B.instance)
    assert state.on_grant(lease, t_send=100.0, now=100.2) is True
    assert state.deadline == pytest.approx(100.0 + FAST.lease_window) and state.held_term == 3
    assert state.on_grant(lease, t_send=100.1, now=100.2) is None  # old news: ignored
    assert state.deadline == pytest.approx(100.0 + FAST.lease_window)


def test_on_grant_refuses_what_it_cannot_vouch_for() -> None:
    lease = Lease("default", B.node_id, "", 3, None, FAST.ttl, instance=B.instance)
    seen_higher = ElectionState("default", B, FAST)
    seen_higher.high_water = 3  # a term this node already saw: only a round can tell
    assert seen_higher.on_grant(lease, 100.0, 100.1) is None
    in_flight = ElectionState("default", B, FAST)
    in_flight.maybe_held = True  # an unanswered request may hold some term
    assert in_flight.on_grant(lease, 100.0, 100.1) is None
    too_old = ElectionState("default", B, FAST)
    assert too_old.on_grant(lease, 100.0, 100.0 + FAST.ttl) is None
    someone_else = dataclasses.replace(lease, instance="another-process")
    assert ElectionState("default", B, FAST).on_grant(someone_else, 100.0, 100.1) is None
    assert too_old.held_term is None and seen_higher.held_term is None


async def test_a_stopping_standby_stands_down_and_gives_back_a_grant_it_missed() -> None:
    store = LeaseStore(RealClock())
    a, b, b_backend, tasks = await leader_and_standby(store, a_grants=False)
    granted_to(B, store, 7, store.clock.wall())  # granted, its news not yet heard
    b.stop()
    await tasks.pop()
    assert store.heard[B.node_id, B.instance][1] is False  # no longer campaigning
    assert [c.args[:3] for c in b_backend.methods("release")] == [("default", "node-b", 7)]
    a.stop()
    await asyncio.gather(*tasks)
