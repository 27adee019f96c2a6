"""ElectionStatus: the answer every endpoint, CLI command and watcher receives (docs/api.md)."""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Role(StrEnum):
    LEADER = "leader"
    FOLLOWER = "follower"
    # Not yet known, backend unreachable for over one ttl, or self-fenced.
    UNKNOWN = "unknown"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    node_id: str
    address: str
    term: int
    acquired_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class ElectionStatus:
    election: str
    node_id: str
    role: Role
    leader: LeaderInfo | None
    term: int
    ttl: float
    # Seconds left before the local self-fence deadline; None unless this node leads.
    valid_for: float | None
    revision: int
    changed_at: dt.datetime

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def to_dict(self) -> dict[str, Any]:
        leader = self.leader
        return {
            "election": self.election,
            "node_id": self.node_id,
            "role": self.role.value,
            "is_leader": self.is_leader,
            "leader": None
            if leader is None
            else {
                "node_id": leader.node_id,
                "address": leader.address,
                "term": leader.term,
                "acquired_at": format_time(leader.acquired_at),
            },
            "term": self.term,
            "lease": None
            if self.valid_for is None
            else {"ttl_ms": round(self.ttl * 1000), "valid_for_ms": int(self.valid_for * 1000)},
            "revision": self.revision,
            "changed_at": format_time(self.changed_at),
        }


@functools.lru_cache(maxsize=64)  # the same few instants, formatted for every watcher
def format_time(when: dt.datetime | None) -> str | None:
    """RFC 3339 in UTC with milliseconds and a Z, as in docs/api.md."""
    if when is None:
        return None
    utc = when.astimezone(dt.UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
