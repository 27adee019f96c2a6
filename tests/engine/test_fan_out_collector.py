"""No automatic garbage collection while the long polls one change woke write their answers
(leaderd/election/collector_pause.py): with 10,000 open, one full collection holds every
answer back by hundreds of milliseconds. The collector runs again right after them."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from leaderd.election.collector_pause import CollectorPause
from leaderd.election.engine import Election

from .world import A, World, settle

WAITERS = 200


@pytest.fixture
def eager_collector() -> Iterator[list[str]]:
    """A collector that runs after every few allocations; yields the collections' log."""
    started: list[str] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(f"generation {info['generation']}")

    thresholds = gc.get_threshold()
    gc.set_threshold(10, 1, 1)
    gc.callbacks.append(seen)
    try:
        yield started
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*thresholds)
        gc.enable()


async def answered_allocating(election: Election, revision: int, log: list[str]) -> None:
    """A long poll whose woken continuation allocates as an answer does."""
    await election.wait_for_answer(revision, 60)
    log.append("answered")
    _ = [[] for _ in range(100)]  # past the threshold: a collection is due


async def test_no_collection_runs_between_a_change_and_its_answers(
    eager_collector: list[str],
) -> None:
    world = World()
    election = world.add(A)
    first = election.status()
    waiters = [
        asyncio.create_task(answered_allocating(election, first.revision, eager_collector))
        for _ in range(WAITERS)
    ]
    await settle()
    election.add_listener(lambda status: eager_collector.append("publish"))
    await election.round()  # leads: a change wakes every waiter
    await asyncio.gather(*waiters)
    woken = eager_collector[eager_collector.index("publish") :]
    assert woken.count("answered") == WAITERS
    last = len(woken) - woken[::-1].index("answered")
    assert [entry for entry in woken[:last] if entry.startswith("generation")] == []
    await asyncio.sleep(0)
    assert gc.isenabled()
    _ = [[] for _ in range(100)]
    assert eager_collector[-1].startswith("generation")  # collecting again


async def test_a_collector_disabled_by_the_program_stays_disabled() -> None:
    world = World()
    election = world.add(A)
    first = election.status()
    waiter = asyncio.create_task(election.wait_for_answer(first.revision, 60))
    await settle()
    gc.disable()
    try:
        await election.round()
        await waiter
        await settle()
        assert not gc.isenabled()
    finally:
        gc.enable()


async def test_nested_pauses_resume_after_the_last() -> None:
    pause = CollectorPause()
    loop = asyncio.get_running_loop()
    with pause.paused(loop):
        with pause.paused(loop):
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert not gc.isenabled()  # until the loop ran what the blocks queued
    await asyncio.sleep(0)
    assert gc.isenabled()


def test_a_pause_whose_loop_closed_first_does_not_outlive_it() -> None:
    pause = CollectorPause()
    closed = asyncio.new_event_loop()
    with pause.paused(closed):
        pass
    closed.close()  # before its resume ran
    try:
        assert not gc.isenabled()

        async def later() -> None:
            with pause.paused(asyncio.get_running_loop()):
                assert not gc.isenabled()
            await asyncio.sleep(0)

        asyncio.run(later())
        assert gc.isenabled()
    finally:
        gc.enable()
