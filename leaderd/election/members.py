"""GET /members: the election's members as this node last heard them, with their roles
derived at the moment of the answer (docs/api.md, "Members").

A member is the ``leader`` while it holds the lease this node knows to be live, a
``standby`` while heard from within its ttl (``unhealthy`` while its health checks fail,
``witness`` with priority 0: neither may be handed the lease), and ``stale`` after that
(ages keep growing while this node cannot reach the backend, so everyone turns stale: fail
closed). Two live
members with one node id are a ``conflict`` (rule 9, docs/algorithm.md): both are listed,
neither counts as a healthy standby.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..backends.records import Member
from .status import format_time


class MemberRole(StrEnum):
    LEADER = "leader"
    STANDBY = "standby"
    UNHEALTHY = "unhealthy"  # live, but its health checks fail: it does not campaign
    WITNESS = "witness"  # live, priority 0: never leads
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class MemberView:
    member: Member
    role: MemberRole
    age: float  # seconds since the backend last heard from it
    conflict: bool

    def to_dict(self) -> dict[str, Any]:
        m = self.member
        return {
            "node_id": m.node_id,
            "instance": m.instance,
            "address": m.address,
            "version": m.version,
            "role": self.role.value,
            "conflict": self.conflict,
            "last_heard_at": format_time(m.heard_at),
            "age_ms": int(self.age * 1000),
            "priority": m.priority,
            "campaigning": m.campaigning,
            "health": m.health or None,
        }


@dataclass(frozen=True, slots=True)
class Members:
    election: str
    node_id: str  # this node
    term: int
    members: tuple[MemberView, ...]

    @property
    def leader(self) -> MemberView | None:
        return next((v for v in self.members if v.role is MemberRole.LEADER), None)

    def standby_ids(self) -> list[str]:
        """The node ids of the healthy standbys (heard within their ttl, no twin), sorted."""
        ids = {v.member.node_id for v in self.members if v.role is MemberRole.STANDBY}
        return sorted(ids - {v.member.node_id for v in self.members if v.conflict})

    @property
    def healthy_standbys(self) -> int:
        return sum(v.role is MemberRole.STANDBY and not v.conflict for v in self.members)

    @property
    def cluster_size(self) -> int:
        """Members that are not stale, the leader included."""
        return sum(v.role is not MemberRole.STALE for v in self.members)

    @property
    def cluster_ready(self) -> bool:
        """A live leader is listed and no node id is in conflict."""
        return self.leader is not None and not any(v.conflict for v in self.members)

    def by_state(self) -> dict[str, int]:
        """Members counted once each (the leaderd_members metric): leader, standby (healthy),
        unhealthy, witness, conflict (a live non-leader sharing a node id), stale."""
        counts = dict.fromkeys(
            ("leader", "standby", "unhealthy", "witness", "conflict", "stale"), 0
        )
        for v in self.members:
            live_twin = v.conflict and v.role is MemberRole.STANDBY
            counts["conflict" if live_twin else v.role.value] += 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        leader = self.leader
        return {
            "election": self.election,
            "node_id": self.node_id,
            "leader": leader.member.node_id if leader else None,
            "term": self.term,
            "members": [v.to_dict() for v in self.members],
            "cluster_size": self.cluster_size,
            "healthy_standbys": self.healthy_standbys,
            "cluster_ready": self.cluster_ready,
        }


def members_of(
    election: str,
    node_id: str,
    term: int,
    heard: tuple[Member, ...],
    elapsed: float,
    holder: tuple[str, str] | None,
) -> Members:
    """The members as heard ``elapsed`` seconds ago; ``holder``: the (node id, instance)
    this node knows to lead now, None when it knows of no live leader."""
    ages = [(m, m.heard_ago + max(0.0, elapsed)) for m in heard]
    live = [m for m, age in ages if age < m.ttl]
    twins = Counter(m.node_id for m in live)
    views = []
    for m, age in ages:
        if holder == (m.node_id, m.instance):
            role = MemberRole.LEADER
        else:
            role = _live_role(m) if age < m.ttl else MemberRole.STALE
        conflict = role is not MemberRole.STALE and twins[m.node_id] > 1
        views.append(MemberView(m, role, age, conflict))
    views.sort(key=lambda v: (v.role is not MemberRole.LEADER, v.member.node_id, v.age))
    return Members(election, node_id, term, tuple(views))


def _live_role(m: Member) -> MemberRole:
    if m.priority == 0:
        return MemberRole.WITNESS
    return MemberRole.UNHEALTHY if m.health else MemberRole.STANDBY
