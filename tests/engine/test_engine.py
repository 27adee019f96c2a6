"""Election engine unit tests: tables of steps on a fake clock against a recording backend.

Each case drives ``Election.round()`` and ``Election.status()`` by hand, moving the fake
clock between steps, so every deadline is exact. ``run()`` itself is covered by a few
short real-time tests at the end (asyncio's own timeouts run on real time).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from leaderd.backends.asks import Ask
from leaderd.backends.base import Candidate, Lease, LeaseLost
from leaderd.backends.static import StaticBackend
from leaderd.election.engine import Election
from leaderd.election.status import ElectionStatus, Role
from leaderd.election.timing import Timing, TimingError

from .fakes import FakeClock, LeaseStore, RealClock, RecordingBackend

TIMING = Timing(ttl=15, renew_interval=5, retry_interval=2, clock_drift=0.01, safety_margin=0.2)
WINDOW = TIMING.lease_window  # 14.65: t_send + WINDOW is the self-fence deadline
A = Candidate("node-a", "10.0.0.1:8080")
B = Candidate("node-b", "10.0.0.2:8080")
C = Candidate("node-c", "10.0.0.3:8080")
LEADER, FOLLOWER, UNKNOWN, STOPPED = Role.LEADER, Role.FOLLOWER, Role.UNKNOWN, Role.STOPPED


@dataclass
class World:
    """One fake clock, one lease table, and one Election per node sharing it."""

    clock: FakeClock = field(default_factory=FakeClock)
    store: LeaseStore = field(init=False)
    nodes: dict[str, tuple[Election, RecordingBackend]] = field(default_factory=dict)
    delays: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.store = LeaseStore(self.clock)

    def add(self, candidate: Candidate, jitter: float = 0.0) -> Election:
        backend = RecordingBackend(self.store)
        election = Election(
            "default", candidate, TIMING, backend, clock=self.clock, jitter=lambda: jitter
        )
        self.nodes[candidate.node_id] = (election, backend)
        return election

    def election(self, node: str) -> Election:
        return self.nodes[node][0]

    def backend(self, node: str) -> RecordingBackend:
        return self.nodes[node][1]


# ---- steps: each is one line of a case's table ----


@dataclass
class Round:
    node: str = "node-a"

    async def __call__(self, w: World) -> None:
        w.delays.append(await w.election(self.node).round())


@dataclass
class Advance:
    seconds: float

    async def __call__(self, w: World) -> None:
        w.clock.advance(self.seconds)


@dataclass
class Fail:
    count: int
    node: str = "node-a"

    async def __call__(self, w: World) -> None:
        w.backend(self.node).fail_next(self.count)


@dataclass
class Rival:
    """Another node (not run by an engine) takes or renews the lease directly; it has
    watched the current lease for a ttl, so it may take it over once expired."""

    holder: Candidate = B

    async def __call__(self, w: World) -> None:
        version = w.store.lease("default").version
        w.store.take("default", self.holder, TIMING.ttl, takeover=version)


TWIN = Candidate("node-a", "10.0.0.9:8080")  # the same node id, another process


@dataclass
class RivalReleases:
    holder: Candidate = B

    async def __call__(self, w: World) -> None:
        w.store.release("default", self.holder, w.store.lease("default").term)


@dataclass
class StepBackendClock:
    """The backend's clock jumps forward: every lease it holds is expired at once."""

    async def __call__(self, w: World) -> None:
        for row in w.store.rows.values():
            row.expires_at = min(row.expires_at, w.clock.now())


@dataclass
class LoseTerms:
    term: int

    async def __call__(self, w: World) -> None:
        w.store.rows["default"].term = self.term


@dataclass
class AnswerTerm:
    """The next acquisition is answered with this term, whatever min_term said."""

    term: int
    node: str = "node-a"

    async def __call__(self, w: World) -> None:
        w.backend(self.node).script.answer_term = self.term


@dataclass
class Holder:
    """Who the backend's row names, expired or not."""

    node_id: str | None

    async def __call__(self, w: World) -> None:
        assert w.store.rows["default"].holder == self.node_id


@dataclass
class Takeovers:
    """The takeover argument of each acquire the node sent so far."""

    versions: list[str]
    node: str = "node-a"

    async def __call__(self, w: World) -> None:
        assert w.backend(self.node).takeovers == self.versions


@dataclass
class Duplicates:
    count: int
    node: str = "node-a"

    async def __call__(self, w: World) -> None:
        assert w.election(self.node).duplicates_seen == self.count


@dataclass
class Refused:
    count: int
    node: str = "node-a"

    async def __call__(self, w: World) -> None:
        assert w.election(self.node).terms_refused == self.count


@dataclass
class LoseRace:
    node: str = "node-a"

    async def __call__(self, w: World) -> None:
        w.backend(self.node).lose_next_race(B)


@dataclass
class Resign:
    cooldown: float
    node: str = "node-a"
    to: str = ""

    async def __call__(self, w: World) -> None:
        w.election(self.node).resign(self.cooldown, self.to)


@dataclass
class Expect:
    """The answer status() gives now; None fields are not checked."""

    role: Role
    leader: str | None = None
    term: int | None = None
    valid_for: float | None = None
    revision: int | None = None
    node: str = "node-a"

    async def __call__(self, w: World) -> None:
        status = w.election(self.node).status()
        assert status.role is self.role
        assert status.is_leader is (self.role is LEADER)
        assert (status.leader.node_id if status.leader else None) == self.leader
        if self.term is not None:
            assert status.term == self.term
        if self.role is LEADER:
            assert status.leader is not None and status.leader.term == status.term
            assert status.valid_for is not None and status.valid_for > 0
        else:
            assert status.valid_for is None
        if self.valid_for is not None:
            assert status.valid_for == pytest.approx(self.valid_for)
        if self.revision is not None:
            assert status.revision == self.revision


@dataclass
class Calls:
    """The methods this node's backend received since the last Calls step."""

    methods: list[str]
    node: str = "node-a"

    async def __call__(self, w: World) -> None:
        backend = w.backend(self.node)
        # Waits, and history reads after a change of holder (tested on their own), aside.
        made = [c.method for c in backend.calls if c.method not in ("wait_for_change", "history")]
        seen = getattr(backend, "_checked", 0)
        assert made[seen:] == self.methods
        backend._checked = len(made)  # type: ignore[attr-defined]


@dataclass
class Delay:
    """The delay the last round asked for before the next one."""

    seconds: float

    async def __call__(self, w: World) -> None:
        assert w.delays[-1] == pytest.approx(self.seconds)


@dataclass
class Timeout:
    """The timeout the last acquire_or_renew call carried."""

    seconds: float
    node: str = "node-a"

    async def __call__(self, w: World) -> None:
        timeout = w.backend(self.node).methods("acquire_or_renew")[-1].args[3]
        assert timeout == pytest.approx(self.seconds)


Step = Round | Advance | Fail | Rival | LoseRace | Resign | Expect | Calls | Delay | Timeout

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


async def settle() -> None:
    """Let every ready task run until it blocks again."""
    for _ in range(10):
        await asyncio.sleep(0)


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
    world.backend("node-a").script.grant = 6.0
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


# ---- run(): a few short real-time tests with tiny intervals ----

FAST = Timing(ttl=0.3, renew_interval=0.1, retry_interval=0.05, safety_margin=0.01)


def fast_node(store: LeaseStore, candidate: Candidate = A) -> tuple[Election, RecordingBackend]:
    backend = RecordingBackend(store)
    election = Election("default", candidate, FAST, backend, clock=RealClock(), jitter=lambda: 0.0)
    return election, backend


async def until(condition: Callable[[], bool], within: float = 1.0) -> None:
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - polls the engine, which has no event for it
            await asyncio.sleep(0.001)


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
