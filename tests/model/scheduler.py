"""The seeded random scheduler: a few daemons contest one election on virtual time, a chaos
task (or a named case's script) drives them, and every request and wake-up meets the
network's faults; the checker looks at every step. Everything random comes from one seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from .chaos import Chaos
from .checker import Checker
from .cluster import Cluster, World
from .hosttime import host_time
from .network import FAULTS, SERVER, Faults
from .vloop import VirtualLoop

WorldOf = Callable[[VirtualLoop, random.Random, Callable[[str], None]], World]


@dataclass(frozen=True)
class Plan:
    """One run: its world, seed and length, its faults, and what drives the daemons."""

    world: WorldOf
    seed: int
    steps: int
    faults: Faults = FAULTS
    names: tuple[str, ...] = ("a", "b", "c")
    chaos: bool = True  # random resigns, restarts and pauses
    suspends: bool = True  # a third of the pauses are host suspends
    scenario: Callable[[Cluster], Awaitable[None]] | None = None  # a named case's script


@dataclass
class Report:
    seed: int
    steps: int
    virtual_seconds: float
    seconds: float
    leaderships: int
    top_term: int
    counts: Counter[str]
    story: list[str]  # the last events of the run, as a violation would tell them

    def __str__(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        rate = self.steps / self.seconds if self.seconds else 0.0
        return (f"seed {self.seed}: {self.steps} steps ({rate:.0f}/s), "
                f"{self.virtual_seconds:.0f}s virtual in {self.seconds:.1f}s, "
                f"{self.leaderships} leaderships up to term {self.top_term}; {faults}")  # fmt: skip


def run(plan: Plan) -> Report:
    """Run ``plan.steps`` loop iterations; raise checker.Violation at the first broken
    invariant."""
    rng = random.Random(plan.seed)
    loop = VirtualLoop()
    story: deque[str] = deque(maxlen=80)

    def tell(line: str) -> None:
        story.append(f"{loop.time():.4f} {line}")

    world = plan.world(loop, rng, tell)
    cluster = Cluster(loop, world, rng, plan.faults, plan.names)
    cluster.tell = tell
    checker = Checker(cluster.members, world.lease_until, loop.time, story=story)
    done: asyncio.Future[None] = loop.create_future()

    def step() -> None:
        checker.step()
        if loop.steps >= plan.steps and not done.done():
            done.set_result(None)

    loop.on_step = step
    started = time.perf_counter()
    with _quiet(), host_time(lambda name: cluster.nodes[name].clock), world.installed():
        try:
            for name in plan.names:
                cluster.start(name)
            if plan.chaos:
                chaos = Chaos(cluster, random.Random(rng.random()), plan.suspends)
                loop.create_task(chaos.run(), context=SERVER.copy())
            if plan.scenario is not None:
                loop.create_task(plan.scenario(cluster), context=SERVER.copy())
            loop.run_until_complete(done)
        finally:
            _shut(loop)
    return Report(plan.seed, loop.steps, loop.time(), time.perf_counter() - started,
                  checker.leaderships, checker.top_term, cluster.counts, list(story))  # fmt: skip


def _shut(loop: VirtualLoop) -> None:
    loop.on_step = lambda: None
    for name in list(loop.paused):
        loop.resume(name)
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    with contextlib.suppress(BaseException):
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.close()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The daemons' logs cost time and say nothing the checker does not."""
    logger = logging.getLogger("leaderd")
    level, logger.level = logger.level, logging.CRITICAL
    try:
        yield
    finally:
        logger.level = level
