"""The encoded answers long polls get (Election.wait_for_answer): a change that says
"leader" is judged again for each woken waiter, at the instant it is answered; any other
change is encoded once and shared by every waiter it wakes."""

from __future__ import annotations

import asyncio

import orjson

from leaderd.election.answers import EncodedStatus
from leaderd.election.engine import Election
from leaderd.election.status import ElectionStatus, Role

from .world import TIMING, A, World, settle


def same_instant(election: Election, answer: EncodedStatus) -> None:
    status = election.status()  # the fake clock has not moved since the answer
    assert orjson.loads(answer.body) == status.to_dict()
    assert (answer.role, answer.revision) == (status.role, status.revision)


def time_passes_once_leading(world: World, election: Election, seconds: float) -> None:
    """The clock moves by ``seconds`` as "leader" is published: after the waiters are woken,
    before any of them runs (listeners are called within the publish)."""

    def moved(status: ElectionStatus) -> None:
        if status.role is Role.LEADER:
            world.clock.advance(seconds)

    election.add_listener(moved)


async def test_a_leader_whose_deadline_passed_while_its_waiters_woke_is_not_answered() -> None:
    world = World()
    election = world.add(A)
    first = election.status()
    waiters = [asyncio.create_task(election.wait_for_answer(first.revision, 60)) for _ in range(3)]
    await settle()
    time_passes_once_leading(world, election, TIMING.ttl)  # past the self-fence deadline
    await election.round()
    answers = [await waiter for waiter in waiters]
    for answer in answers:
        assert answer.role is Role.UNKNOWN
        assert orjson.loads(answer.body)["is_leader"] is False
    same_instant(election, answers[-1])


async def test_a_leader_answer_is_judged_for_each_waiter() -> None:
    world = World()
    election = world.add(A)
    first = election.status()
    waiter = asyncio.create_task(election.wait_for_answer(first.revision, 60))
    await settle()
    time_passes_once_leading(world, election, 0.5)  # the answer shows the time left now
    await election.round()
    answer = await waiter
    assert answer.role is Role.LEADER
    same_instant(election, answer)


async def test_waiters_woken_by_one_change_share_its_encoding() -> None:
    world = World()
    election = world.add(A)
    await election.round()
    leading = election.status()
    waiters = [
        asyncio.create_task(election.wait_for_answer(leading.revision, 60)) for _ in range(3)
    ]
    await settle()
    world.clock.advance(TIMING.ttl)
    election.status()  # the deadline passed: "unknown" is published
    answers = [await waiter for waiter in waiters]
    assert answers[0].revision == leading.revision + 1
    assert all(answer is answers[0] for answer in answers)
    same_instant(election, answers[0])


async def test_a_long_poll_that_times_out_answers_the_status_now() -> None:
    world = World()
    election = world.add(A)
    await election.round()
    leading = election.status()
    answer = await election.wait_for_answer(leading.revision, 0.01)
    assert answer.revision == leading.revision
    same_instant(election, answer)
