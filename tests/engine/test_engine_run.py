"""``Election.run()`` itself: a few short real-time tests with tiny intervals (asyncio's own
timeouts run on real time), against the recording backend or the static one."""

from __future__ import annotations

import asyncio
import logging

import pytest

from leaderd.backends.asks import Ask
from leaderd.backends.base import Lease, LeaseLost
from leaderd.backends.static import StaticBackend
from leaderd.election.engine import Election
from leaderd.election.status import ElectionStatus, Role
from leaderd.election.timing import Timing

from .clocks import RealClock
from .fakes import LeaseStore, RecordingBackend
from .world import (
    FAST,
    LEADER,
    STOPPED,
    UNKNOWN,
    A,
    B,
    World,
    fast_node,
    until,
)


async def test_run_on_the_static_backend_leads_then_releases_on_stop() -> None:
    backend = StaticBackend()
    election = Election("default", A, FAST, backend, jitter=lambda: 0.0)
    task = asyncio.create_task(election.run())
    await until(lambda: election.status().is_leader)
    assert election.ready and election.health() is None
    election.stop()
    await task
    assert (await backend.observe("default")).holder is None


async def test_stop_publishes_at_once_then_hook_then_release_with_the_held_term() -> None:
    store = LeaseStore(RealClock())
    election, backend = fast_node(store)
    order: list[str] = []

    async def hook(name: str) -> None:
        assert not election.status().is_leader
        assert store.lease(name).held_by(A)  # not yet released
        order.append("hook")

    election.step_down_hook = hook
    task = asyncio.create_task(election.run())
    await until(lambda: election.status().is_leader)
    await asyncio.sleep(0.25)  # a few renewals
    assert election.status().term == 1
    election.stop()
    assert election.status().role is STOPPED
    await task
    releases = backend.methods("release")
    assert order == ["hook"] and [c.args for c in releases] == [("default", "node-a", 1)]
    assert store.lease("default").holder is None and store.lease("default").term == 1


async def test_a_release_that_raises_a_backend_bug_is_a_release_in_doubt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An untranslated exception from the release (a backend bug) is logged with its
    traceback as a failed release, and the term is never led on again; before, it ended the
    election's task, and the daemon exited 0 without a word of it."""
    store = LeaseStore(RealClock())
    election, backend = fast_node(store)
    task = asyncio.create_task(election.run())
    await until(lambda: election.status().is_leader)
    backend.script.release_raises = AssertionError("a bug in the backend")
    election.stop()
    await task  # ends normally
    failed = [r for r in caplog.records if r.getMessage().startswith("could not release")]
    assert len(failed) == 1 and "AssertionError('a bug in the backend')" in failed[0].getMessage()
    assert failed[0].exc_info is not None
    assert election.state.in_doubt.term == 1
    assert store.lease("default").held_by(A)  # it expires by itself within ttl


async def test_standby_leads_at_once_after_the_leader_stops() -> None:
    store = LeaseStore(RealClock())
    a, _ = fast_node(store, A)
    b, _ = fast_node(store, B)
    run_a = asyncio.create_task(a.run())
    await until(lambda: a.status().is_leader)
    run_b = asyncio.create_task(b.run())
    await until(lambda: b.status().leader is not None)
    a.stop()
    await run_a
    await until(lambda: b.status().is_leader, within=0.03)  # woken, not polling
    assert b.status().term == 2
    b.stop()
    await run_b


async def test_stop_during_an_acquire_whose_answer_was_lost_still_releases() -> None:
    store = LeaseStore(RealClock())
    election, backend = fast_node(store)
    backend.script.lose_answer = True
    task = asyncio.create_task(election.run())
    await until(lambda: bool(backend.methods("acquire_or_renew")))
    election.stop()
    await task
    assert len(backend.methods("acquire_or_renew")) == 1
    assert store.lease("default").holder is None  # the lease it did not know it won


@pytest.mark.parametrize("fault", ["broken_wait", "spurious_wait"])
async def test_a_misbehaving_wait_for_change_does_not_spin(fault: str) -> None:
    store = LeaseStore(RealClock())
    store.take("default", B, 60)
    election, backend = fast_node(store)
    setattr(backend.script, fault, True)
    task = asyncio.create_task(election.run())
    await asyncio.sleep(0.3)
    election.stop()
    await task
    # Polling alone makes 3 rounds in 0.3 s; a spin makes thousands.
    assert len(backend.methods("acquire_or_renew")) <= 0.3 / 0.02 + 2
    assert len(backend.methods("wait_for_change")) <= 0.3 / 0.02 + 2
    assert election.status().role is STOPPED


async def test_resign_in_run_releases_at_once_and_campaigns_after_cooldown() -> None:
    store = LeaseStore(RealClock())
    election, _ = fast_node(store)
    task = asyncio.create_task(election.run())
    await until(lambda: election.status().is_leader)
    election.resign(0.15)
    assert not election.status().is_leader
    await until(lambda: store.lease("default").holder is None, within=0.05)
    await until(lambda: election.status().is_leader, within=0.5)
    assert election.status().term == 2
    election.stop()
    await task


async def test_stop_abandons_a_slow_renew_and_still_releases() -> None:
    store = LeaseStore(RealClock())
    backend = RecordingBackend(store)
    slow = Timing(ttl=30, renew_interval=0.05, retry_interval=0.05)  # renew timeout ≈ 29 s
    election = Election("default", A, slow, backend, clock=RealClock(), jitter=lambda: 0.0)
    task = asyncio.create_task(election.run())
    await until(lambda: election.status().is_leader)
    backend.hang_next(store.clock.now() + 60)
    renewals = len(backend.methods("acquire_or_renew"))
    await until(lambda: len(backend.methods("acquire_or_renew")) > renewals)
    election.stop()
    async with asyncio.timeout(0.5):
        await task
    assert [c.args for c in backend.methods("release")] == [("default", "node-a", 1)]
    assert store.lease("default").holder is None


async def test_stop_after_a_lost_renew_answer_releases_the_term_it_took() -> None:
    clock = RealClock()
    store = LeaseStore(clock)
    backend = RecordingBackend(store)
    election = Election("default", A, FAST, backend, clock=clock, jitter=lambda: 0.0)
    task = asyncio.create_task(election.run())
    await until(lambda: election.status().is_leader)
    backend.script.lose_answer = True
    clock.jump(FAST.ttl)  # a pause: the lease lapses here and at the backend
    await until(lambda: not backend.script.lose_answer)  # the renewal took term 2, unheard
    election.stop()
    await task
    assert store.lease("default").term == 2
    assert store.lease("default").holder is None
    assert backend.methods("release")[-1].args == ("default", "node-a", 2)


async def test_a_release_that_times_out_is_logged_in_words(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = LeaseStore(RealClock())
    election, backend = fast_node(store)
    task = asyncio.create_task(election.run())
    await until(lambda: election.status().is_leader)
    election.stop()
    backend.hang_next(store.clock.now() + 60)  # the release hangs
    await task
    assert (
        "could not release election default, term 1: request timed out; "
        "it expires by itself within ttl" in caplog.messages
    )


class StuckBackend(RecordingBackend):
    """Its acquire can block past its timeout, as a lock wait may (the engine allows
    timeout + wait)."""

    stuck = False

    async def acquire_or_renew(self, ask: Ask) -> Lease:
        if self.stuck:
            self._record("acquire_or_renew", (ask.election, ask.candidate.node_id, ask.ttl,
                                              ask.timeout))  # fmt: skip
            await asyncio.Event().wait()
        return await super().acquire_or_renew(ask)


async def test_watchers_hear_a_follower_fail_closed_while_its_request_is_in_flight() -> None:
    store = LeaseStore(RealClock())
    store.take("default", B, 60)
    backend = StuckBackend(store)
    timing = Timing(ttl=0.25, renew_interval=0.1, retry_interval=0.1, safety_margin=0.01)
    election = Election("default", A, timing, backend, clock=RealClock(), jitter=lambda: 0.0)
    heard: list[tuple[Role, str | None]] = []
    election.add_listener(lambda status: heard.append((status.role, election.last_error)))
    task = asyncio.create_task(election.run())
    await until(lambda: election.status().leader is not None)
    backend.stuck = True
    # The next round starts 0.1 s after the last answer and may last 0.2 s: past the ttl.
    await until(lambda: (UNKNOWN, None) in heard)  # published with the request still out
    assert election.last_error is None
    election.stop()
    await task


async def test_a_failed_first_attempt_makes_the_election_ready_and_tells_listeners() -> None:
    world = World()
    election = world.add(A)
    heard: list[tuple[Role, bool]] = []
    election.add_listener(lambda status: heard.append((status.role, election.ready)))
    world.backend("node-a").fail_next(1)
    assert not election.ready
    await election.round()
    assert election.ready and election.status().role is UNKNOWN
    assert heard == [(UNKNOWN, True)]  # once, with no new revision
    assert election.status().revision == 1


async def test_a_change_that_proves_the_lease_gone_steps_down_before_any_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """etcd's watch showed our key deleted (a revoked lease): the leader says so at the
    event, not at its next renewal or its deadline; the round after asks again."""
    caplog.set_level(logging.INFO, logger="leaderd.engine")
    store = LeaseStore(RealClock())
    # Renewals that succeed change nothing to publish: only the event can step it down.
    after = await lose_at_an_event(*fast_node(store), store)
    said = "stepping down from election default, term 1: etcd deleted the leader key"
    assert said in caplog.text
    assert after.role is LEADER  # the round after: the store kept the lease


async def test_a_holder_listens_for_a_lost_lease_up_to_its_very_next_round() -> None:
    """Renewing every 15 ms, every wait of the leader is within a breath of its next round:
    it listens all the same, so a lost lease never waits for a renewal's answer."""
    store = LeaseStore(RealClock())
    breathless = Timing(ttl=0.3, renew_interval=0.015, retry_interval=0.05, safety_margin=0.01)
    backend = RecordingBackend(store)
    election = Election("default", A, breathless, backend, clock=RealClock(), jitter=lambda: 0.0)
    await lose_at_an_event(election, backend, store)


async def lose_at_an_event(
    election: Election, backend: RecordingBackend, store: LeaseStore
) -> ElectionStatus:
    """Run ``election`` until it leads; a change then proves the lease gone: the next
    status published must be UNKNOWN. Returns the status published after that one."""
    task = asyncio.create_task(election.run())
    await until(lambda: election.status().is_leader)
    with election.stream() as changes:
        assert (await changes.get()).role is LEADER
        backend.script.lost = LeaseLost("etcd deleted the leader key at revision 9")
        store.touch()
        assert (await asyncio.wait_for(changes.get(), 1)).role is UNKNOWN
        after = await asyncio.wait_for(changes.get(), 1)
    election.stop()
    await task
    return after
