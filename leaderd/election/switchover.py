"""Whether POST /resign may go ahead (docs/api.md, "Hand-over to a chosen standby").

A resign that cannot do what it says changes nothing: a follower has nothing to resign (unless
it is told a cooldown, which keeps it out of the election), and a switchover goes only to a
standby this node heard from within one renew interval and that has not stopped, so a typo
or a stopped node never leaves the election leaderless for a ttl.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backends.records import LEFT_TTL
from .engine import Election
from .members import MemberRole, MemberView
from .status import Role


@dataclass(frozen=True, slots=True)
class Refusal:
    """An error answer: HTTP status, error code, message."""

    status: int
    code: str
    message: str


def refusal(election: Election, me: str, to: str, cooldown_given: bool) -> Refusal | None:
    """Why this resign cannot go ahead; None if it can. ``cooldown_given``: the request named
    a cooldown, which a follower may take (stay out of the election for that long)."""
    if to == me:
        return Refusal(400, "bad_parameter", f"to names this node ({me}): name a standby")
    if to and not election.reserves:
        message = f"election {election.name}: this backend has no standbys to hand over to"
        return Refusal(409, "no_standby", message)
    status = election.status()
    if status.role is not Role.LEADER and (to or not cooldown_given):
        leader = status.leader.node_id if status.leader else "unknown"
        message = f"this node does not lead election {election.name} (leader: {leader})"
        advice = ": ask the leader to hand over" if to else ": nothing to resign"
        return Refusal(409, "not_leader", message + advice)
    return not_a_standby(election, to) if to else None


def not_a_standby(election: Election, to: str) -> Refusal | None:
    """Why ``to`` cannot take a switchover from this node's last renewal's view of the
    members; None if it can (docs/api.md)."""
    listed, renew = election.members(), election.timing.renew_interval

    def views(node_id: str) -> list[MemberView]:
        return [v for v in listed.members if v.member.node_id == node_id]

    why = _why_not(views(to), renew)
    if why is None:
        return None
    ids = sorted({v.member.node_id for v in listed.members})
    live = ", ".join(n for n in ids if _why_not(views(n), renew) is None) or "none"
    message = f"{to} {why} (election {election.name}, live standbys: {live}); see GET /members"
    return Refusal(409, "not_a_standby", message)


def _why_not(views: list[MemberView], renew_interval: float) -> str | None:
    # A stopping member's last heartbeat (LEFT_TTL) lists it stale, and the next request
    # prunes it: either way it has left.
    if all(v.member.ttl == LEFT_TTL for v in views):
        return "has stopped or is not a member"
    if any(v.role is MemberRole.WITNESS for v in views):
        return "has priority 0 (a witness: it never leads)"
    if sick := [v.member.health for v in views if v.role is MemberRole.UNHEALTHY]:
        return f"is unhealthy ({sick[0]})"
    standbys = [v for v in views if v.role is MemberRole.STANDBY]
    if any(v.conflict for v in standbys):
        return "runs twice under one node id (conflict)"
    # Its heartbeat as of this node's last renewal: a live standby is heard every retry_interval.
    fresh = [v for v in standbys if v.member.heard_ago <= renew_interval]
    if not fresh:
        age = min(v.age for v in views)
        return f"was last heard {age:.1f}s ago, more than renew_interval ({renew_interval:g}s)"
    return None
