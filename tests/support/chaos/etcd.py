"""The chaos harness (tests/support/chaos/harness.py) on a 3-member etcd cluster: the daemon faults
of every backend, and faults of the etcd members themselves.

Daemon ``node-i`` lists the members starting with member ``i mod 3``, so each member is the
preferred endpoint of some daemons and a member fault aims at the one the targeted daemon
talks to (its leader, usually). Every member fault holds the cluster back while it lasts, so
a leader is owed from its heal.

| fault | what happens |
| --- | --- |
| ``etcd_kill`` | SIGKILL the targeted daemon's preferred member; restarted after 0.2-2 s |
| ``etcd_leader_kill`` | SIGKILL the member that is raft leader; restarted after 0.2-2 s |
| ``etcd_stop`` | SIGSTOP the targeted daemon's preferred member, SIGCONT as long as ``sigstop`` |
| ``etcd_quorum_loss`` | stop two of the three members (no quorum) for 0.2 s-2 ttl, start them |
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time

from tests.support.chaos.check import Fault
from tests.support.chaos.harness import Chaos
from tests.support.chaos.node import Node
from tests.support.chaos.proxy import FaultProxy, RuleBook
from tests.support.chaos.settings import Settings
from tests.support.daemons import short_tempdir
from tests.support.etcd_cluster import EtcdCluster, Member

# etcd's lessor looks for expired leases every 500 ms.
LESSOR = 0.5


class EtcdChaos(Chaos):
    def __init__(self, settings: Settings, cluster: EtcdCluster | None = None) -> None:
        # The liveness bound allows for etcd's lease of whole seconds (ttl 1.5 s is a 2 s
        # lease) and for its lessor's period, on top of the slack asked for.
        settings.slack += math.ceil(settings.ttl) - settings.ttl + LESSOR
        super().__init__(settings)
        self.etcd = cluster
        self.own_etcd = cluster is None

    async def _start(self) -> None:
        s = self.s
        self.workdir = short_tempdir("chaos-")
        if self.etcd is None:
            self.etcd = await asyncio.to_thread(EtcdCluster, 3)
        members = self.etcd.members
        prefix = f"/chaos-{os.getpid()}-{int(time.time())}/"
        for i in range(s.nodes):
            first = i % len(members)
            url = self.etcd.url(prefix=prefix, members=members[first:] + members[:first])
            # Each member through a proxy of this daemon's, for the per-request faults.
            rules, via = RuleBook(), {}
            for member in members:
                host, port = member.hostport.rsplit(":", 1)
                proxy = await FaultProxy(f"node-{i}", host, int(port), "http", rules).start()
                via[member.hostport] = proxy
            scheme, _, rest = url.partition("://")
            hosts, _, tail = rest.partition("/")
            hosts = ",".join(f"127.0.0.1:{via[h].port}" for h in hosts.split(","))
            daemon = self._daemon(f"node-{i}", f"{scheme}://{hosts}/{tail}")
            proxies = list(via.values())
            self.nodes.append(Node(daemon, None, self.obs, s, proxies))
        await self._launch()

    def _restart(self, node: Node) -> None:
        """A restarted daemon is no target until it is ready: a SIGTERM that comes before it
        has installed its handlers (its first ~0.3 s) kills it with -15 (docs/chaos.md)."""
        super()._restart(node)
        node.busy = True
        self._spawn(self._until_ready(node))

    async def _until_ready(self, node: Node) -> None:
        with contextlib.suppress(AssertionError):  # it exited: the monitor says so
            await asyncio.to_thread(node.daemon.wait_ready, 30)
        node.busy = False

    async def _heal_all(self) -> None:
        assert self.etcd is not None
        await asyncio.to_thread(self.etcd.ensure_running)
        await super()._heal_all()

    async def _stop(self) -> None:
        await super()._stop()
        if self.etcd is not None:
            await asyncio.to_thread(
                self.etcd.cleanup if self.own_etcd else self.etcd.ensure_running
            )

    # ---- member faults ----

    def _preferred(self, fault: Fault) -> Member:
        """The member the targeted daemon asks first; the fault's target from now on."""
        assert self.etcd is not None
        index = int(fault.target.rsplit("-", 1)[1]) % len(self.etcd.members)
        member = self.etcd.members[index]
        fault.params["daemon"], fault.target = fault.target, member.name
        return member

    async def _kill_and_restart(self, fault: Fault, member: Member) -> None:
        assert self.etcd is not None
        await asyncio.to_thread(self.etcd.kill, member)
        fault.params["restart_after_s"] = delay = round(self.rng.uniform(0.2, 2.0), 3)
        await asyncio.sleep(delay)
        await asyncio.to_thread(self.etcd.start, member)
        fault.healed = time.monotonic()

    async def _fault_etcd_kill(self, fault: Fault) -> None:
        await self._kill_and_restart(fault, self._preferred(fault))

    async def _fault_etcd_leader_kill(self, fault: Fault) -> None:
        assert self.etcd is not None
        leader = await asyncio.to_thread(self.etcd.leader)
        if leader is None:  # between two raft leaders: any member will do
            leader = self.etcd.members[self.rng.randrange(len(self.etcd.members))]
        fault.params["daemon"], fault.target, fault.target_role = fault.target, leader.name, "-"
        await self._kill_and_restart(fault, leader)

    async def _fault_etcd_stop(self, fault: Fault) -> None:
        assert self.etcd is not None
        member = self._preferred(fault)
        fault.params["stopped_s"] = pause = round(self._pause(), 3)
        self.etcd.pause(member)
        await asyncio.sleep(pause)
        self.etcd.resume(member)
        fault.healed = time.monotonic()

    async def _fault_etcd_quorum_loss(self, fault: Fault) -> None:
        assert self.etcd is not None
        down = self.rng.sample(self.etcd.members, 2)
        fault.params["daemon"], fault.target, fault.target_role = fault.target, "quorum", "-"
        fault.params["members"] = [m.name for m in down]
        fault.params["held_s"] = hold = round(self.rng.uniform(0.2, 2 * self.s.ttl), 3)
        for member in down:
            await asyncio.to_thread(self.etcd.kill, member)
        await asyncio.sleep(hold)
        for member in down:
            await asyncio.to_thread(self.etcd.start, member, False)
        await asyncio.to_thread(self.etcd.wait_healthy)
        fault.healed = time.monotonic()
