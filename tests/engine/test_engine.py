"""Election engine unit tests: tables of steps on a fake clock against a recording backend.

Each case drives ``Election.round()`` and ``Election.status()`` by hand, moving the fake
clock between steps, so every deadline is exact (the steps are in world.py).
test_engine_moments.py holds the cases that are no table, test_engine_run.py ``run()`` itself.
"""

from __future__ import annotations

import pytest

from .world import (
    FOLLOWER,
    LEADER,
    TIMING,
    TWIN,
    UNKNOWN,
    WINDOW,
    A,
    Advance,
    AnswerTerm,
    B,
    C,
    Calls,
    Delay,
    Duplicates,
    Expect,
    Fail,
    Holder,
    LoseRace,
    LoseTerms,
    Refused,
    Resign,
    Rival,
    RivalReleases,
    Round,
    Step,
    StepBackendClock,
    Takeovers,
    Timeout,
    World,
)

CASES: dict[str, list[Step]] = {
    "first round acquires": [
        Expect(UNKNOWN, None, term=0, revision=1),
        Round(),
        Expect(LEADER, "node-a", term=1, valid_for=WINDOW, revision=2),
        Calls(["acquire_or_renew"]),
        Delay(TIMING.renew_interval),
    ],
    "renew keeps the term and moves the deadline": [
        Round(),
        Advance(5),
        Expect(LEADER, "node-a", term=1, valid_for=WINDOW - 5),
        Round(),
        Expect(LEADER, "node-a", term=1, valid_for=WINDOW, revision=2),
        Calls(["acquire_or_renew", "acquire_or_renew"]),
    ],
    "lost race: follower naming the holder": [
        LoseRace(),
        Round(),
        Expect(FOLLOWER, "node-b", term=1, revision=2),
    ],
    "renew fails until the deadline: leader just before it, unknown at it": [
        Round(),
        Fail(99),
        Advance(5),
        Round(),
        Delay(TIMING.retry_interval),
        Advance(2),
        Round(),
        Advance(WINDOW - 7 - 1e-6),
        Expect(LEADER, "node-a", term=1, revision=2),
        Advance(1e-6),
        Expect(UNKNOWN, None, term=1, revision=3),
    ],
    "renew timeout never outlasts the deadline": [
        Round(),
        Timeout(TIMING.renew_interval),
        Fail(1),
        Advance(5),
        Round(),
        Timeout(WINDOW - 5),
        Advance(2),
        Round(),
        Timeout(WINDOW - 7),
    ],
    "pause longer than the ttl: first answer is not leader": [
        Round(),
        Advance(TIMING.ttl + 5),
        Expect(UNKNOWN, None),
        Round(),
        Expect(LEADER, "node-a", term=2, valid_for=WINDOW),
    ],
    "re-acquire after expiry takes term + 1": [
        Round(),
        Advance(TIMING.ttl),
        Round(),
        Expect(LEADER, "node-a", term=2),
    ],
    "a rival takes over after our lease expired; we follow it": [
        Round(),
        Advance(TIMING.ttl),
        Rival(),
        Round(),
        Expect(FOLLOWER, "node-b", term=2),
    ],
    "resign with cooldown: release, observe only, campaign after": [
        Round(),
        Resign(10),
        Expect(FOLLOWER, None, term=1, revision=3),
        Calls(["acquire_or_renew"]),
        Round(),
        Calls(["release", "observe"]),
        Expect(FOLLOWER, None, term=1, revision=3),
        Delay(5),
        Advance(5),
        Round(),
        Calls(["observe"]),
        Delay(5),
        Advance(5),
        Round(),
        Calls(["acquire_or_renew"]),
        Expect(LEADER, "node-a", term=2, revision=4),
    ],
    "re-acquire after release takes term + 1": [
        Round(),
        Resign(0),
        Round(),
        Calls(["acquire_or_renew", "release", "acquire_or_renew"]),
        Expect(LEADER, "node-a", term=2),
    ],
    "cooldown wakes the loop when it ends": [
        Round(),
        Resign(3),
        Round(),
        Delay(3),
    ],
    "revision moves once per change, not on a plain renewal": [
        Expect(UNKNOWN, revision=1),
        Round(),
        Expect(LEADER, "node-a", revision=2),
        Advance(5),
        Round(),
        Advance(5),
        Round(),
        Expect(LEADER, "node-a", revision=2),
        Fail(99),
        Advance(WINDOW),
        Expect(UNKNOWN, revision=3),
        Expect(UNKNOWN, revision=3),
        Round(),
        Expect(UNKNOWN, revision=3),
    ],
    "follower sees the leader's lease expire by its expires_in": [
        Rival(),
        Advance(5),
        Round(),
        Expect(FOLLOWER, "node-b", term=1),
        Delay(TIMING.retry_interval),
        Advance(10 - 1e-6),
        Expect(FOLLOWER, "node-b", term=1, revision=2),
        Advance(1e-6),
        Expect(FOLLOWER, None, term=1, revision=3),
    ],
    "follower fails closed after one ttl without contact": [
        Rival(),
        Round(),
        Expect(FOLLOWER, "node-b"),
        Fail(99),
        Rival(),
        Advance(5),
        Round(),
        Rival(),
        Advance(5),
        Round(),
        Rival(),
        Advance(5 - 1e-6),
        Expect(FOLLOWER, "node-b"),
        Advance(1e-6),
        Expect(UNKNOWN, None),
    ],
    "follower watches a holder every retry_interval, to see each renewal": [
        Rival(),
        Advance(12),
        Round(),
        Delay(TIMING.retry_interval),
        Rival(),
        Round(),
        Delay(TIMING.retry_interval),
    ],
    "follower of a free lease polls every renew_interval (a change wakes it sooner)": [
        Round(),
        Resign(0),
        Round(),
        Round(),
        Delay(TIMING.renew_interval),
    ],
    "a dead holder is taken over one ttl after its last renewal was first seen": [
        Rival(),
        Round(),
        Advance(13.9),
        Round(),
        Expect(FOLLOWER, "node-b", term=1),
        Advance(1.1),  # the backend's expiry (15 s) and our own ttl (15 s) have both passed
        Round(),
        Expect(LEADER, "node-a", term=2),
        Takeovers(["", "", "1"]),
    ],
    "a backend clock step forward does not cut a live lease short (rule 3)": [
        Rival(),
        Round(),
        Advance(1),
        StepBackendClock(),
        Round(),
        Expect(FOLLOWER, None, term=1),  # the backend says expired ...
        Advance(1),
        Round(),
        Expect(FOLLOWER, None, term=1),  # ... but we saw that lease only 2 s ago
        Holder("node-b"),
        Takeovers(["", "", ""]),
    ],
    "a fresh standby waits one ttl before taking over an unreleased lease": [
        Rival(),
        Advance(14),
        Round(),
        Advance(2),
        Round(),
        Expect(FOLLOWER, None, term=1),
        Holder("node-b"),
        Advance(13),
        Round(),
        Expect(LEADER, "node-a", term=2),
    ],
    "a released lease is taken at once": [
        Rival(),
        Round(),
        RivalReleases(),
        Round(),
        Expect(LEADER, "node-a", term=2),
    ],
    "a duplicate node id is another holder: wait, then a new term (rule 9)": [
        Rival(TWIN),
        Round(),
        Expect(FOLLOWER, "node-a", term=1),
        Duplicates(1),
        Advance(TIMING.ttl),
        Round(),
        Expect(LEADER, "node-a", term=2),
        Duplicates(1),
    ],
    "an acquisition is at least the high-water mark + 1": [
        Rival(),
        Round(),
        RivalReleases(),
        LoseTerms(0),  # the backend forgets every term (a restored backup)
        Round(),
        Expect(LEADER, "node-a", term=2),
    ],
    "a granted term at or below the high-water mark is refused, then released (rule 4)": [
        Rival(),
        Round(),
        RivalReleases(),
        AnswerTerm(1),  # a backend that lost acknowledged writes grants term 1 again
        Round(),
        Expect(FOLLOWER, None),
        Refused(1),
        Round(),  # releases the doubtful term, then campaigns again at once
        Round(),
        Expect(LEADER, "node-a", term=2),
    ],
    "a lost contact is not a lost lease: the leader renews on": [
        Round(),
        Fail(1),
        Advance(5),
        Round(),
        Advance(2),
        Round(),
        Expect(LEADER, "node-a", term=1, valid_for=WINDOW, revision=2),
    ],
}


@pytest.mark.parametrize("steps", CASES.values(), ids=CASES.keys())
async def test_engine_table(steps: list[Step]) -> None:
    world = World()
    world.add(A)
    for step in steps:
        await step(world)


TWO_NODES: dict[str, list[Step]] = {
    "two nodes: one leads, the other follows it": [
        Round("node-a"),
        Round("node-b"),
        Expect(LEADER, "node-a", term=1, node="node-a"),
        Expect(FOLLOWER, "node-a", term=1, node="node-b"),
    ],
    "paused leader: the other takes over, the paused one answers not leader": [
        Round("node-a"),
        Round("node-b"),
        Advance(TIMING.ttl),
        Round("node-b"),
        Expect(LEADER, "node-b", term=2, node="node-b"),
        Expect(UNKNOWN, None, node="node-a"),
        Round("node-a"),
        Expect(FOLLOWER, "node-b", term=2, node="node-a"),
    ],
    "resign hands over: the other acquires with term + 1 at once": [
        Round("node-a"),
        Round("node-b"),
        Resign(30, node="node-a"),
        Round("node-a"),
        Round("node-b"),
        Expect(LEADER, "node-b", term=2, node="node-b"),
        Round("node-a"),
        Expect(FOLLOWER, "node-b", term=2, node="node-a"),
    ],
}


# node-a leads, node-b and node-c follow; node-a hands over to node-c.
HAND_OVER = [Round("node-a"), Round("node-b"), Round("node-c"), Resign(0, "node-a", to="node-c")]
THREE_NODES: dict[str, list[Step]] = {
    "hand-over: only the named standby acquires, with term + 1, at once": [
        *HAND_OVER,
        Round("node-a"),
        Calls(["acquire_or_renew", "release", "acquire_or_renew"]),
        Round("node-b"),
        Delay(TIMING.retry_interval),  # reserved for node-c: asked again, never jittered
        Expect(FOLLOWER, None, term=1, node="node-b"),
        Round("node-c"),
        Expect(LEADER, "node-c", term=2, node="node-c"),
        Round("node-a"),
        Round("node-b"),
        Expect(FOLLOWER, "node-c", term=2, node="node-b"),
        Expect(FOLLOWER, "node-c", term=2, node="node-a"),
    ],
    "hand-over to a standby that never asks: after one ttl another acquires": [
        *HAND_OVER,
        Round("node-a"),  # released, reserved for node-c, which is stopped
        Round("node-b"),
        Advance(TIMING.ttl - 0.01),
        Round("node-b"),
        Round("node-a"),  # cooldown 0: the old leader campaigns too, and is refused
        Expect(FOLLOWER, None, term=1, node="node-b"),
        Expect(FOLLOWER, None, term=1, node="node-a"),
        Delay(0.01),  # the next round falls when the reservation ends
        Advance(0.01),
        Round("node-b"),
        Expect(LEADER, "node-b", term=2, node="node-b"),
    ],
}


@pytest.mark.parametrize("steps", THREE_NODES.values(), ids=THREE_NODES.keys())
async def test_three_nodes_table(steps: list[Step]) -> None:
    world = World()
    for candidate in (A, B, C):
        world.add(candidate)
    for step in steps:
        await step(world)
        assert len([e for e, _ in world.nodes.values() if e.status().is_leader]) <= 1


@pytest.mark.parametrize("steps", TWO_NODES.values(), ids=TWO_NODES.keys())
async def test_two_nodes_table(steps: list[Step]) -> None:
    world = World()
    world.add(A)
    world.add(B)
    for step in steps:
        await step(world)
        leaders = [e.name for e, _ in world.nodes.values() if e.status().is_leader]
        assert len(leaders) <= 1


@pytest.mark.parametrize(("jitter", "delay"), [(0.0, 2.0), (0.5, 2.2), (1.0, 2.4)])
async def test_retry_jitter_is_bounded(jitter: float, delay: float) -> None:
    world = World()
    world.add(A, jitter=jitter)
    world.backend("node-a").fail_next(1)
    assert await world.election("node-a").round() == pytest.approx(delay)
