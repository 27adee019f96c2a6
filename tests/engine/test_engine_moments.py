"""Election engine unit tests that are no table: the sentences it logs, requests in flight
when the world changes, health and watchers, and the timing rules. On the fake clock of
world.py, driving ``Election.round()`` by hand."""

from __future__ import annotations

import asyncio
import logging

import pytest

from leaderd.backends.base import Lease
from leaderd.election.status import Role
from leaderd.election.timing import Timing, TimingError

from .world import (
    LEADER,
    TIMING,
    UNKNOWN,
    WINDOW,
    A,
    World,
    settle,
)

# ---- decisions are logged as one sentence ----


async def test_step_down_at_the_deadline_is_one_sentence(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="leaderd.engine")
    world = World()
    election = world.add(A)
    await election.round()
    world.backend("node-a").fail_next(99)
    world.clock.advance(5)
    await election.round()
    world.clock.advance(WINDOW - 5)
    assert election.status().role is UNKNOWN
    await asyncio.sleep(0)  # a change's sentence follows its publish by a loop turn
    sentences = [m for m in caplog.messages if "stepping down" in m]
    assert len(sentences) == 1
    assert sentences[0].startswith("stepping down from election default, term 1: ")
    assert sentences[0].endswith("no successful renewal for 14.6s, deadline passed")
    assert "acquired election default, term 1" in caplog.messages


async def test_resign_logs_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="leaderd.engine")
    world = World()
    election = world.add(A)
    await election.round()
    election.resign(10)
    await election.round()
    assert (
        "stepping down from election default, term 1: resigned, not campaigning for 10s"
        in caplog.messages
    )
    assert "released election default, term 1" in caplog.messages


# ---- requests in flight when the world changes ----


async def test_renew_sent_before_a_pause_does_not_make_it_leader() -> None:
    world = World()
    election = world.add(A)
    await election.round()
    world.clock.advance(5)
    world.backend("node-a").script.answer_at = world.clock.now() + TIMING.ttl
    renew = asyncio.create_task(election.round())
    await settle()  # served before the pause...
    world.clock.advance(TIMING.ttl)  # ...but its answer is read after it
    await renew
    assert world.store.lease("default").expired
    assert election.status().role is UNKNOWN
    assert election.lease_left() is None


async def test_deadline_passes_while_the_renew_is_in_flight() -> None:
    world = World()
    election = world.add(A)
    await election.round()
    world.clock.advance(5)
    world.backend("node-a").hang_next(world.clock.now() + 60)
    renew = asyncio.create_task(election.round())
    await settle()
    world.clock.advance(WINDOW - 5)
    assert election.status().role is UNKNOWN  # the answer is derived, not awaited
    await renew  # the request gave up at its timeout: the deadline
    assert election.status().role is UNKNOWN
    assert election.last_error is not None and "timed out" in election.last_error


@pytest.mark.parametrize("cooldown", [0.0, 0.5, 30.0])
async def test_resign_while_a_renew_is_in_flight(cooldown: float) -> None:
    world = World()
    election = world.add(A)
    await election.round()
    world.clock.advance(5)
    world.backend("node-a").hang_next(world.clock.now() + 1)
    renew = asyncio.create_task(election.round())
    await settle()
    election.resign(cooldown)
    assert not election.status().is_leader
    world.clock.advance(1)
    await renew  # the renewal succeeded at the backend, after the resign
    assert not election.status().is_leader
    assert election.status().revision == 3
    await election.round()
    release = world.backend("node-a").methods("release")
    assert [c.args for c in release] == [("default", "node-a", 1)]


@pytest.mark.parametrize("cooldown", [0.0, 30.0])
async def test_resign_while_an_acquire_is_in_flight(cooldown: float) -> None:
    world = World()
    election = world.add(A)
    world.backend("node-a").hang_next(world.clock.now() + 1)
    acquire = asyncio.create_task(election.round())
    await settle()
    election.resign(cooldown)
    world.clock.advance(1)
    await acquire
    assert not election.status().is_leader
    await election.round()
    assert [c.args for c in world.backend("node-a").methods("release")] == [
        ("default", "node-a", 1)
    ]


async def test_shorter_grant_than_asked_shortens_the_deadline() -> None:
    world = World()
    election = world.add(A)
    world.backend("node-a").script.grant_seconds = 6.0
    await election.round()
    assert election.lease_left() == pytest.approx(6.0 * (1 - TIMING.clock_drift) - 0.2)


async def test_a_failing_listener_does_not_break_the_engine() -> None:
    world = World()
    election = world.add(A)
    seen = []

    def broken(_: object) -> None:
        raise RuntimeError("listener bug")

    election.add_listener(broken)
    election.add_listener(lambda status: seen.append(status.role))
    await election.round()
    assert seen == [LEADER]
    assert election.status().is_leader


async def test_an_untranslated_backend_error_fails_closed_instead_of_crashing() -> None:
    world = World()
    election = world.add(A)
    await election.round()
    assert election.status().is_leader

    async def buggy(*args: object, **kwargs: object) -> Lease:
        raise RuntimeError("driver state error")

    world.backend("node-a").acquire_or_renew = buggy  # type: ignore[method-assign]
    delay = await election.round()
    assert delay == pytest.approx(TIMING.retry_interval)
    assert election.last_error == "driver state error"
    world.clock.advance(WINDOW)
    assert election.status().role is Role.UNKNOWN


# ---- health and watchers ----


async def test_health_reports_a_stall() -> None:
    world = World()
    election = world.add(A)
    assert election.health() is None
    await election.round()
    world.clock.advance(1)
    assert election.health() is None
    world.clock.advance(60)
    health = election.health()
    assert health is not None and "stalled" in health


async def test_wait_for_change_answers_on_the_next_revision() -> None:
    world = World()
    election = world.add(A)
    first = election.status()
    assert (await election.wait_for_change(first.revision + 5, timeout=1)).revision == 1
    waiter = asyncio.create_task(election.wait_for_change(first.revision, timeout=5))
    await settle()
    assert election.watchers == 1
    await election.round()
    changed = await waiter
    assert changed.revision == first.revision + 1 and changed.is_leader
    assert election.watchers == 0
    timed_out = await election.wait_for_change(None, timeout=0.01)
    assert timed_out.revision == changed.revision


async def test_stream_gets_current_then_each_change() -> None:
    world = World()
    election = world.add(A)
    with election.stream() as queue:
        assert election.watchers == 1
        await election.round()
        world.clock.advance(TIMING.ttl)
        election.status()
        roles = [queue.get_nowait().role for _ in range(queue.qsize())]
    assert roles == [UNKNOWN, LEADER, UNKNOWN]
    assert election.watchers == 0


# ---- timing rules (rule 8): each rejected with one line naming it ----

BAD_TIMING = {
    "retry_interval must be > 0": Timing(retry_interval=0),
    "renew_interval (1s) must be >= retry_interval (2s)": Timing(renew_interval=1),
    "ttl (10s) must be greater than renew_interval * 2": Timing(ttl=10),
    "clock_drift must be in [0, 0.1)": Timing(clock_drift=0.1),
    "clock_drift must be in [0, 0.1) (got -0.01)": Timing(clock_drift=-0.01),
    "safety_margin must be >= 0": Timing(safety_margin=-1),
    "must exceed renew_interval (5s)": Timing(safety_margin=10),
    "ttl (nan": Timing(ttl=float("nan")),
}


@pytest.mark.parametrize(("rule", "timing"), BAD_TIMING.items(), ids=BAD_TIMING.keys())
def test_bad_timing_is_rejected_with_one_line(rule: str, timing: Timing) -> None:
    with pytest.raises(TimingError) as raised:
        timing.validate("jobs")
    message = str(raised.value)
    assert rule in message and "\n" not in message and message.startswith("election jobs: ")


def test_good_timing_is_accepted() -> None:
    TIMING.validate()
    Timing().validate()
    Timing(ttl=0.3, renew_interval=0.1, retry_interval=0.05, safety_margin=0.01).validate()
