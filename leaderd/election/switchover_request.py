"""A switchover asked for from any node (docs/api.md, "Switchover from any node"): the asking
node writes it into its own member record (every heartbeat carries it, so it is kept by the
backend, in the election's own storage, and outlives any one leader), and whoever leads acts
on it at its next round, by the ordinary hand-over to a chosen standby.

It is a request, never a decision: the leader carries it out only while its node is a
standby a hand-over may go to (healthy, campaigning, fresh), and only between ``at`` and
``until`` on the wall clock (a schedule people write; no deadline or age rests on it). The
asking node withdraws it once its node leads, or once it expired.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..backends.records import Member
from .status import LeaderInfo, format_time


@dataclass(frozen=True, slots=True)
class SwitchoverRequest:
    """Hand the election over to node id ``to``, not before ``at``, not after ``until``
    (seconds since the epoch)."""

    to: str
    at: float
    until: float

    def encode(self) -> str:
        """As a member record carries it (node ids hold no spaces)."""
        return f"{self.to} {self.at:.3f} {self.until:.3f}"

    @classmethod
    def decode(cls, text: str) -> SwitchoverRequest | None:
        try:
            to, at, until = text.split(" ")
            return cls(to, float(at), float(until))
        except ValueError:
            return None  # none, or written by another version

    def due(self, wall: float) -> bool:
        return self.at <= wall < self.until

    def to_dict(self, by: str) -> dict[str, Any]:
        return {"to": self.to, "requested_by": by, "at": _when(self.at),
                "expires_at": _when(self.until)}  # fmt: skip


def pending(members: Sequence[Member], wall: float) -> list[tuple[str, SwitchoverRequest]]:
    """(asking node id, request) of every member's request not yet expired, soonest first."""
    found = [(m.node_id, r) for m in members if (r := SwitchoverRequest.decode(m.switchover))]
    return sorted(((by, r) for by, r in found if wall < r.until), key=lambda f: f[1].at)


def due_to(members: Sequence[Member], able: Sequence[Member], me: str, wall: float) -> str:
    """The node a leader (``me``) hands over to now for a request; "" for none. ``able``:
    the standbys a hand-over may go to."""
    ids = {m.node_id for m in able}
    due = [r.to for _, r in pending(members, wall) if r.due(wall) and r.to != me]
    return next((to for to in due if to in ids), "")


def still_wanted(text: str, leader: LeaderInfo | None, wall: float) -> str:
    """This node's own request as its next heartbeat carries it: withdrawn ("") once its
    node leads or it expired."""
    request = SwitchoverRequest.decode(text)
    led = leader is not None and leader.node_id == request.to if request else False
    if request is None or led or wall >= request.until:
        return ""
    return text


def _when(seconds: float) -> str | None:
    try:
        return format_time(dt.datetime.fromtimestamp(seconds, dt.UTC))
    except (OverflowError, ValueError, OSError):
        return None
