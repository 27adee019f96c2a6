"""What happens to the daemons at random moments: resigns (with and without a chosen
standby), restarts, pauses (SIGSTOP), host suspends (CLOCK_MONOTONIC stands still) and
partitions (a daemon cut off from the server while the others go on)."""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Callable

from .cluster import Cluster, Node


class Chaos:
    def __init__(
        self, cluster: Cluster, rng: random.Random, suspends: bool = True, every: float = 2.0
    ) -> None:
        self.cluster, self.rng, self.every = cluster, rng, every
        self.suspends = suspends

    async def run(self) -> None:
        actions: list[Callable[[Node], None]] = [
            self.resign, self.restart, self.pause, self.partition]  # fmt: skip
        while True:
            await asyncio.sleep(self.rng.expovariate(1 / self.every))
            node = self.rng.choice(list(self.cluster.nodes.values()))
            if node.election is None or node.name in self.cluster.loop.paused:
                continue
            self.rng.choices(actions, weights=(5, 2, 3, 2))[0](node)

    def resign(self, node: Node) -> None:
        others = [n for n in self.cluster.nodes if n != node.name]
        to = self.rng.choice(["", *others])
        cooldown = self.rng.choice([0.0, 0.0, self.cluster.timing.ttl / 2])
        self.cluster.counts["resign_to" if to else "resign"] += 1
        self.cluster.resign(node.name, cooldown, to)

    def restart(self, node: Node) -> None:
        self.cluster.counts["restart"] += 1
        down = self.rng.choice([0.0, self.rng.uniform(0, 2 * self.cluster.timing.ttl)])
        self.cluster.loop.create_task(self.cluster.restart(node.name, down), context=node.context)

    def pause(self, node: Node) -> None:
        """SIGSTOP for a while; a third of them a host suspend."""
        suspend = self.suspends and self.rng.random() < 0.33
        self.cluster.counts["suspend" if suspend else "pause"] += 1
        self.cluster.pause(node.name, suspend)
        resume_in = self.rng.uniform(0, 1.5 * self.cluster.timing.ttl)
        self.cluster.loop.call_later(
            resume_in, self.cluster.resume, node.name, context=contextvars.Context()
        )

    def partition(self, node: Node) -> None:
        """Cut the node off from the server for a while: its requests and wake-ups are lost."""
        if node.link.faults.drop == 1.0:
            return  # already cut off
        self.cluster.counts["partition"] += 1
        self.cluster.cut_off(node.name)
        heal_in = self.rng.uniform(0, 2 * self.cluster.timing.ttl)
        self.cluster.loop.call_later(
            heal_in, self.cluster.heal, node.name, context=contextvars.Context()
        )
