"""Who may ask for the lease, and when a leader whose health checks fail hands over
(docs/algorithm.md, "Who leads"). Pure rules: the engine feeds in its candidate (whose
priority and health every heartbeat writes) and the members its last answer listed.

None of this lets anyone past the takeover rule, the term or self-fencing: a node that may
not campaign only sends reads, and a leader that hands over does so by the ordinary resign.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..backends.asks import Heir
from ..backends.base import Candidate
from ..backends.records import Member
from .heir import heir_of


def barred(candidate: Candidate) -> str:
    """Why this node may not ask for a lease it does not hold ("" if it may)."""
    if candidate.priority == 0:
        return "priority 0 (a witness: it never leads)"
    return f"unhealthy: {candidate.health}" if candidate.health else ""


def heirs(
    members: Sequence[Member], heir: Heir, elapsed: float, campaigning: bool = True
) -> list[Member]:
    """The members ``heir`` allows a grant to go to (campaigning ones, judged ``elapsed``
    seconds after the answer that listed them), best first: the highest priority, then the
    freshest. What a leader sees before it hands over; the backend decides in its write.
    ``campaigning`` False: a backend whose standbys' heartbeats do not say it (the advisory
    lock's standbys wait inside the lock, heard by reads)."""
    able = [
        m
        for m in members
        if (m.campaigning or not campaigning)
        and heir.may_inherit(m.node_id, m.heard_ago + elapsed, m.ttl, m.priority, m.health)
    ]
    return sorted(able, key=lambda m: (-m.priority, m.heard_ago))


def standbys(
    members: Sequence[Member], me: Candidate, elapsed: float, grants: bool
) -> list[Member]:
    """The standbys a leader may hand over to: those its backend's grant may pick, or,
    on a backend that does not grant, every live (heard within its ttl) healthy standby of
    priority above 0, which takes the freed lease itself."""
    heir = heir_of(me) if grants else replace(heir_of(me), heard_within_ttls=1.0)
    return heirs(members, heir, elapsed, campaigning=grants)


def hands_over(policy: str, me: Candidate, able: Sequence[Member]) -> bool:
    """Whether a leader whose checks fail (``me.health``) gives the lease up now:
    ``handover`` only to a healthy standby (``able``), ``step-down`` always, ``keep`` never.
    handover is the default because stepping down with nobody healthy to take over leaves
    the election leaderless for a ttl at least, which an application that is half up
    rarely prefers."""
    if not me.health or policy == "keep":
        return False
    return policy == "step-down" or bool(able)


class Failback:
    """``--failback DELAY``: a leader hands over to a standby of higher priority once it has
    seen it able to inherit (healthy, campaigning, fresh) at every one of its own rounds for
    ``delay`` seconds; one round without it starts the count again, so a flapping node never
    draws leadership (hysteresis). None: off."""

    def __init__(self, delay: float | None) -> None:
        self.delay = delay
        self._since: dict[str, float] = {}  # node id -> first of the rounds that listed it

    def due(self, able: Sequence[Member], me: Candidate, now: float) -> str:
        """The node id to hand over to now ("" for none); ``able``: best first (heirs)."""
        if self.delay is None:
            return ""
        better = [m.node_id for m in able if m.priority > me.priority]
        self._since = {n: self._since.get(n, now) for n in better}
        return next((n for n in better if now - self._since[n] >= self.delay), "")

    def reset(self) -> None:
        """Not leading: what a later term sees counts from then."""
        self._since = {}


def decide(
    policy: str,
    failback: Failback,
    me: Candidate,
    able: Sequence[Member],
    now: float,
    asked: str = "",
) -> tuple[str, str] | None:
    """What a leader does after its round (``able``: heirs, best first; ``asked``: a
    switchover due to that node): None, keep leading; else hand over, to (node id, "" for
    whoever the grant picks) with (end reason)."""
    if hands_over(policy, me, able):
        how = "handed over" if able else "stepped down"
        return "", f"{how}: leader unhealthy ({me.health})"
    if asked:
        return asked, f"handed over to {asked}"
    to = failback.due(able, me, now)
    return (to, f"handed over: failback to {to}") if to else None
