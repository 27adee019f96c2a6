"""What the engine tells the backend for members and history: the end reason of a release,
the term it lost for want of the backend, when it reads the history again; and the roles
GET /members derives (members.py), on a fake clock."""

from __future__ import annotations

import asyncio
import datetime as dt

from leaderd.backends.records import EndReason, Member
from leaderd.election.members import MemberRole, members_of

from .clocks import RealClock
from .fakes import LeaseStore
from .world import TIMING, WINDOW, A, B, World, fast_node, until


async def test_a_resignation_ends_the_term_as_resigned_and_a_stop_as_released() -> None:
    world = World()
    election = world.add(A)
    await election.round()
    election.resign(10)
    await election.round()
    assert world.backend("node-a").reasons == [EndReason.RESIGNED]

    election, backend = fast_node(LeaseStore(RealClock()))
    task = asyncio.create_task(election.run())
    await until(lambda: election.status().is_leader)
    election.stop()
    await task
    assert backend.reasons == [EndReason.RELEASED]


async def test_a_leader_that_lost_the_backend_says_so_once_at_its_next_answer() -> None:
    world = World()
    a, b = world.add(A), world.add(B)
    await a.round()
    term = a.status().term
    world.backend("node-a").fail_next(99)
    await b.round()  # b starts watching a's lease
    world.clock.advance(WINDOW + 1)  # a's renewals fail past its deadline
    await a.round()
    world.clock.advance(TIMING.ttl)
    await b.round()  # b takes the lapsed lease over
    assert b.status().is_leader
    world.backend("node-a").fail_next(0)
    await a.round()  # a gets through again: the answer shows b
    await a.round()  # ... and the next request says a lost the backend in its term
    await a.round()
    # acquired, failed at the deadline, got through, told, and then no more.
    assert world.backend("node-a").lost_terms == [0, 0, 0, term, 0]


async def test_a_late_renewal_that_still_holds_is_no_loss() -> None:
    world = World()
    a = world.add(A)
    await a.round()
    world.clock.advance(WINDOW + 0.1)  # past the deadline, but the lease (ttl) still lasts
    await a.round()
    await a.round()
    assert a.status().is_leader
    assert world.backend("node-a").lost_terms == [0, 0, 0]


async def test_the_history_is_read_again_only_when_the_holder_changes() -> None:
    world = World()
    a, b = world.add(A), world.add(B)
    await a.round()
    await b.round()
    world.clock.advance(TIMING.renew_interval)
    await a.round()  # a renewal: nothing new to read
    await b.round()
    a.resign(10)
    await a.round()  # released: a change
    await b.round()  # b acquires: a change
    reads = {
        n: [c.method for c in world.backend(n).calls].count("history") for n in ("node-a", "node-b")
    }
    assert reads == {"node-a": 2, "node-b": 2}


def member(node_id: str, instance: str, ago: float, ttl: float = 10.0) -> Member:
    return Member(node_id, instance, "", "1.0", ttl, dt.datetime.now(dt.UTC), ago)


def test_roles_ages_and_conflicts() -> None:
    heard = (
        member("node-b", "b1", 1.0),
        member("node-a", "a1", 0.0),
        member("node-c", "c1", 8.0),  # 8 s + 3 s elapsed: past its ttl
        member("node-d", "d1", 0.5),
        member("node-d", "d2", 0.5),  # the same node id, live: a conflict
        member("node-b", "b0", 30.0),  # node-b's earlier process: stale, no conflict
    )
    r = members_of("default", "node-b", 7, heard, 3.0, ("node-a", "a1"))
    views = [(v.member.node_id, v.member.instance, v.role, v.conflict) for v in r.members]
    assert views == [
        ("node-a", "a1", MemberRole.LEADER, False),
        ("node-b", "b1", MemberRole.STANDBY, False),
        ("node-b", "b0", MemberRole.STALE, False),
        ("node-c", "c1", MemberRole.STALE, False),
        ("node-d", "d1", MemberRole.STANDBY, True),
        ("node-d", "d2", MemberRole.STANDBY, True),
    ]
    assert r.members[1].age == 4.0
    assert (r.cluster_size, r.healthy_standbys, r.cluster_ready) == (4, 1, False)
    states = {"leader": 1, "standby": 1, "unhealthy": 0, "witness": 0, "conflict": 2, "stale": 2}
    assert r.by_state() == states
    assert r.to_dict()["leader"] == "node-a"


def test_without_a_live_leader_nobody_is_leader_and_everyone_ages() -> None:
    heard = (member("node-a", "a1", 0.0), member("node-b", "b1", 0.0))
    r = members_of("default", "node-b", 7, heard, 12.0, None)  # no answer for 12 s > ttl
    assert [v.role for v in r.members] == [MemberRole.STALE, MemberRole.STALE]
    assert (r.to_dict()["leader"], r.healthy_standbys, r.cluster_ready) == (None, 0, False)
