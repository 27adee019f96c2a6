"""The engine tests' world: one fake clock, one lease table, one Election per node, and
the steps a case's table is written in (each step is one line of a table: a round, a move
of the clock, a failure, a rival, an expectation). ``fast_node`` and ``until`` serve the
few real-time tests of ``run()``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from leaderd.backends.base import Candidate
from leaderd.election.engine import Election
from leaderd.election.status import Role
from leaderd.election.timing import Timing

from .clocks import FakeClock, RealClock
from .fakes import LeaseStore, RecordingBackend

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


async def settle() -> None:
    """Let every ready task run until it blocks again."""
    for _ in range(10):
        await asyncio.sleep(0)


FAST = Timing(ttl=0.3, renew_interval=0.1, retry_interval=0.05, safety_margin=0.01)


def fast_node(store: LeaseStore, candidate: Candidate = A) -> tuple[Election, RecordingBackend]:
    backend = RecordingBackend(store)
    election = Election("default", candidate, FAST, backend, clock=RealClock(), jitter=lambda: 0.0)
    return election, backend


async def until(condition: Callable[[], bool], within: float = 1.0) -> None:
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - polls the engine, which has no event for it
            await asyncio.sleep(0.001)
