"""The daemons of one run, each on its own host's clocks, and how to start, stop, resign,
pause and resume them."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from leaderd.backends.base import Backend, BackendUnavailable, Candidate
from leaderd.election.engine import Election
from leaderd.election.timing import Timing

from .checker import Member
from .network import ELECTION, Faults, Link
from .vloop import NODE, NodeClock, VirtualLoop

TIMING = Timing(ttl=5.0, renew_interval=1.5, retry_interval=0.5, clock_drift=0.01,
                safety_margin=0.05)  # fmt: skip


class World(Protocol):
    """A model server and how a daemon connects to it."""

    def backend(self, name: str, link: Link, clock: NodeClock) -> Backend: ...

    def lease_until(self, candidate: Candidate, term: int) -> float: ...

    def installed(self) -> contextlib.AbstractContextManager[None]: ...


@dataclass
class Node:
    name: str
    clock: NodeClock
    link: Link
    election: Election | None = None
    backend: Backend | None = None
    task: asyncio.Task[None] | None = None
    context: contextvars.Context = field(default_factory=contextvars.Context)
    incarnation: int = 0


class Cluster:
    def __init__(self, loop: VirtualLoop, world: World, rng: random.Random, faults: Faults,
                 names: tuple[str, ...], timing: Timing = TIMING) -> None:  # fmt: skip
        self.loop, self.world, self.rng, self.timing = loop, world, rng, timing
        self.faults = faults
        self.counts: Counter[str] = Counter()
        self.tell: Callable[[str], None] = lambda _: None
        drift = timing.clock_drift * 0.475  # any two hosts' rates differ by < clock_drift
        self.nodes = {
            name: Node(name, NodeClock(loop, rng.uniform(1 - drift, 1 + drift),
                                       rng.uniform(1_000, 2_000), rng.uniform(-2, 2)),
                       Link(random.Random(rng.random()), faults, self.counts))
            for name in names
        }  # fmt: skip
        for node in self.nodes.values():
            node.context.run(NODE.set, node.name)
            loop.rates[node.name] = node.clock.rate

    def start(self, name: str) -> None:
        node = self.nodes[name]
        node.incarnation += 1
        me = Candidate(name, f"{name}.host", instance=f"{name}-{node.incarnation:04d}")
        node.backend = self.world.backend(name, node.link, node.clock)
        jitter = random.Random(self.rng.random()).random
        node.election = Election(ELECTION, me, self.timing, node.backend, node.clock, jitter)
        node.task = self.loop.create_task(self._run(node), context=node.context)

    async def _run(self, node: Node) -> None:
        assert node.election is not None and node.backend is not None
        with contextlib.suppress(BackendUnavailable):  # the daemon starts anyway
            await node.backend.open([ELECTION])
        await node.election.run()

    async def restart(self, name: str, down: float) -> None:
        """Stop the daemon (it hands over), keep it down for ``down`` seconds, start anew."""
        node = self.nodes[name]
        task, backend = node.task, node.backend
        assert node.election is not None and task is not None and backend is not None
        self.stop(name)
        node.election = None  # stopping, it leads no more; and no second restart begins
        with contextlib.suppress(Exception):
            await task
        await backend.close()
        await asyncio.sleep(down)
        self.start(name)

    def stop(self, name: str) -> None:
        """SIGTERM: the daemon stops leading and hands over (its task ends after)."""
        node = self.nodes[name]
        assert node.election is not None
        self.tell(f"{name} stops")
        _as(node, node.election.stop)

    def resign(self, name: str, cooldown: float, to: str = "") -> None:
        node = self.nodes[name]
        assert node.election is not None
        self.tell(f"{name} resigns, cooldown {cooldown:g}, to {to!r}")
        _as(node, node.election.resign, cooldown, to)

    def pause(self, name: str, suspend: bool = False) -> None:
        """SIGSTOP the daemon; ``suspend``: the whole host sleeps (CLOCK_MONOTONIC stops)."""
        self.tell(f"{name} {'suspended' if suspend else 'paused'}")
        self.loop.pause(name)
        if suspend:
            self.nodes[name].clock.suspend()

    def resume(self, name: str) -> None:
        self.tell(f"{name} resumes")
        self.nodes[name].clock.wake()
        self.loop.resume(name)

    def cut_off(self, name: str) -> None:
        """A partition: every request and wake-up of the node is lost on the way."""
        self.tell(f"{name} cut off from the server")
        link = self.nodes[name].link
        link.faults = dataclasses.replace(link.faults, drop=1.0, wake_drop=1.0)

    def heal(self, name: str) -> None:
        self.tell(f"{name} reaches the server again")
        self.nodes[name].link.faults = self.faults

    def leader(self) -> str | None:
        """The node that leads now, if any."""
        for m in self.members():
            if m.election.state.leading(m.clock.now()):
                return m.name
        return None

    async def until(self, condition: Callable[[], bool], every: float = 0.05) -> None:
        """Wait (virtual time) until ``condition()`` holds."""
        while not condition():  # noqa: ASYNC110 (polling virtual time costs no real time)
            await asyncio.sleep(every)

    def members(self) -> Iterator[Member]:
        for node in self.nodes.values():
            if node.election is not None:
                yield Member(node.name, node.election, node.clock)


def _as(node: Node, call: Callable[..., None], *args: object) -> None:
    """Call as the node does (in its context: what it schedules is its own)."""
    if NODE.get() == node.name:
        call(*args)
    else:
        node.context.run(call, *args)
