"""Named cases: scripted runs that walk the paths of faults already found (issue 24).

Each returns a Plan: no random chaos, a clean network but for the scripted faults, and a
scenario that drives the daemons into the path. Each case ends in a checker.Violation on a
build with the fault, and runs its steps out cleanly on one without.
"""

from __future__ import annotations

import asyncio

from leaderd.election.engine import Election

from .cluster import Cluster
from .etcdclient import EtcdWorld
from .network import CLEAN, ELECTION
from .rowstore import RowWorld
from .scheduler import Plan, WorldOf

_STEPS = 20_000


def _holder(election: Election) -> str | None:
    """The holder the election's last answer named."""
    lease = election.state.lease
    return None if lease is None else lease.holder


async def _leader(cluster: Cluster) -> str:
    await cluster.until(lambda: cluster.leader() is not None)
    leader = cluster.leader()
    assert leader is not None
    return leader


def late_release(to: bool, world: WorldOf = RowWorld, fate: str = "stall:2.5") -> Plan:
    """Finding 4: the leader resigns (cooldown 0); its release is held on the way for 2.5 s,
    until after the leader gave up on it and renewed the same term; then it reaches the
    server and hands the lease to another node (a reservation with ``to``, else a grant)
    while the old leader still leads. ``fate="lose_answer"``: the control, a release applied
    on time whose answer is lost."""

    async def scenario(cluster: Cluster) -> None:
        leader = await _leader(cluster)
        other = next(name for name in cluster.nodes if name != leader)
        cluster.nodes[leader].link.script["release"] = [fate]
        cluster.resign(leader, 0.0, other if to else "")

    return Plan(world, 4, _STEPS, CLEAN, ("a", "b"), chaos=False, scenario=scenario)


def suspended_spare(suspend: bool = True) -> Plan:
    """Finding 2: a standby's host is suspended for 3 s just after it kept its spare lease
    alive; meanwhile the leader resigns to it. Its spare, aged on CLOCK_MONOTONIC, looks
    fresh: the acquisition sends no keepalive and counts the spare's full ttl. Cut off from
    etcd, it still leads when etcd expires the spare, 3 s sooner. ``suspend=False``: the
    control, a pause with CLOCK_MONOTONIC running on."""

    async def scenario(cluster: Cluster) -> None:
        leader = await _leader(cluster)
        standby = next(name for name in cluster.nodes if name != leader)
        node = cluster.nodes[standby]
        backend = node.backend
        assert isinstance(backend, EtcdWorld.Backend)
        known = backend._election(ELECTION)

        def just_kept() -> bool:
            spare = known.spare
            return (
                spare is not None
                and spare.kept_in is not None
                and node.context.run(lambda: spare.ttl - spare.left() < 0.3)
            )

        await cluster.until(just_kept, every=0.01)
        cluster.pause(standby, suspend)
        cluster.resign(leader, cluster.timing.ttl, standby)
        await asyncio.sleep(3.0)
        cluster.resume(standby)
        await cluster.until(lambda: cluster.leader() == standby)
        cluster.cut_off(standby)

    return Plan(EtcdWorld, 2, _STEPS, CLEAN, ("a", "b"), chaos=False, scenario=scenario)


def cached_heartbeat() -> Plan:
    """Finding 1: the leader resigns to a paused heir. A standby's round keeps its spare alive
    (its stamp H) and reads, then fails: the reservation's timetolive answer is lost. The heir
    resumes and acquires; its watch event makes the standby's next round answer from the
    cache, whose member list shows H: the engine files H under that later round's send time.
    The heir stops and grants the lease to the standby's spare, which leads from the later
    send time; cut off from etcd, it still leads when etcd expires the spare, counted from
    the keepalive that H names."""

    async def scenario(cluster: Cluster) -> None:
        leader = await _leader(cluster)
        heir, standby = (name for name in cluster.nodes if name != leader)
        node = cluster.nodes[standby]
        backend, election = node.backend, node.election
        assert isinstance(backend, EtcdWorld.Backend) and election is not None

        def keeps_next_round() -> bool:  # the next round's _tend sends a keepalive
            spare = backend._election(ELECTION).spare
            return spare is not None and node.context.run(lambda: spare.left() < 3.9)

        await cluster.until(keeps_next_round, every=0.01)
        node.link.script["timetolive"] = ["lose_answer"]
        cluster.pause(heir)
        cluster.resign(leader, cluster.timing.ttl, heir)
        await cluster.until(lambda: election.state.last_error is not None, every=0.001)
        await asyncio.sleep(0.3)
        cluster.resume(heir)  # it acquires while the standby waits for its next round
        await cluster.until(lambda: _holder(election) == heir)  # the cached answer came
        cluster.stop(heir)  # its release grants the lease to the standby's spare
        await cluster.until(lambda: cluster.leader() == standby)
        cluster.cut_off(standby)

    return Plan(EtcdWorld, 1, _STEPS, CLEAN, ("a", "b", "c"), chaos=False, scenario=scenario)


def cached_heartbeat_row() -> Plan:
    """Finding 1 on a lease row: the engine's part alone. A standby's round is answered
    (heartbeat H), then fails; its next round is answered from the backend's cache, which
    names the leader and lists H: the engine files H under that later round's send time. The
    leader stops and grants the lease, expiring one ttl after H; cut off, the standby leads
    past that."""

    async def scenario(cluster: Cluster) -> None:
        leader = await _leader(cluster)
        standby = next(name for name in cluster.nodes if name != leader)
        node = cluster.nodes[standby]
        node.link.script["late_failure"] = ["yes"]
        node.link.script["cached_answer"] = ["no", "yes"]  # the failing round's, the next's
        await cluster.until(lambda: not node.link.script["cached_answer"], every=0.001)
        cluster.stop(leader)  # its release grants the lease to the standby
        await cluster.until(lambda: cluster.leader() == standby)
        cluster.cut_off(standby)

    return Plan(RowWorld, 1, _STEPS, CLEAN, ("a", "b"), chaos=False, scenario=scenario)
