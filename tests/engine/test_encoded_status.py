"""The encoded answer every /leader request gets (Election.encoded_status) is status()
judged at the same instant: its bytes are reused only while nothing they show changed.

Every engine table is run again, and after each step every node's encoded answer is held
against status() on the same fake clock: across a deadline passing, a renewal, a lost race,
a hand-over, and the time left moving by a millisecond with nothing else changing (a
leader's answer is then the last one's bytes with the new number: the same bytes as a full
encoding, byte for byte).
"""

from __future__ import annotations

import orjson
import pytest

from leaderd import jsonio
from leaderd.backends.base import Candidate
from leaderd.election.engine import Election
from leaderd.election.status import Role

from .test_engine import CASES, THREE_NODES, TWO_NODES
from .world import A, Advance, B, C, Round, Step, World

TABLES = {
    **{f"one node: {k}": ([A], v) for k, v in CASES.items()},
    **{k: ([A, B], v) for k, v in TWO_NODES.items()},
    **{k: ([A, B, C], v) for k, v in THREE_NODES.items()},
}


def check(election: Election) -> None:
    encoded = election.encoded_status()
    status = election.status()  # the same instant: the fake clock has not moved
    assert encoded.body == jsonio.dumps(status.to_dict())  # byte for byte
    assert (encoded.role, encoded.revision) == (status.role, status.revision)


@pytest.mark.parametrize(("nodes", "steps"), TABLES.values(), ids=TABLES.keys())
async def test_the_encoded_answer_is_the_status_judged_now(
    nodes: list[Candidate], steps: list[Step]
) -> None:
    world = World()
    for candidate in nodes:
        world.add(candidate)
    for step in steps:
        await step(world)
        for election, _ in world.nodes.values():
            check(election)


async def test_the_time_left_is_shown_to_the_millisecond_and_the_deadline_ends_it() -> None:
    world = World()
    election = world.add(A)
    await Round()(world)
    first = orjson.loads(election.encoded_status().body)["lease"]["valid_for_ms"]
    await Advance(0.0015)(world)  # nothing changed but the time left
    later = orjson.loads(election.encoded_status().body)["lease"]["valid_for_ms"]
    assert first - later in (1, 2)
    left = election.status().valid_for
    assert left is not None
    await Advance(left - 1e-6)(world)
    assert election.encoded_status().role is Role.LEADER
    await Advance(1e-6)(world)  # the deadline: no renewal came
    answer = election.encoded_status()
    assert answer.role is Role.UNKNOWN and orjson.loads(answer.body)["is_leader"] is False


async def test_each_millisecond_of_a_leaders_answer_is_its_full_encoding() -> None:
    world = World()
    election = world.add(A)
    await Round()(world)
    shown = set()
    for _ in range(40):
        await Advance(0.000731)(world)  # the milliseconds left move, nothing else
        check(election)
        shown.add(orjson.loads(election.encoded_status().body)["lease"]["valid_for_ms"])
    await Round()(world)  # a renewal: a later deadline, the same view and revision
    check(election)
    assert len(shown) >= 25
