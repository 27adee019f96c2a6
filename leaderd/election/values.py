"""The values the rules (state.py) hand the engine: the view (the answer at one
instant), the request (what the next round sends) and the notes (what to log, each with
its sentence)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..backends.asks import Ask
from ..backends.base import Lease
from ..events import Event
from .status import LeaderInfo, Role


@dataclass(frozen=True, slots=True)
class View:
    """The answer at one instant: role, leader, term, and the sentence that explains it."""

    role: Role
    leader: LeaderInfo | None
    term: int
    why: str

    @property
    def key(self) -> tuple[Role, str | None, int]:
        """What a revision counts changes of (docs/api.md)."""
        return self.role, self.leader.node_id if self.leader else None, self.term


@dataclass(frozen=True, slots=True)
class Request:
    """What the next round sends: an acquire-or-renew, or an observe while cooling down."""

    campaigning: bool
    # The acquire-or-renew, made by the rules and applied by the backend (sent as an
    # observe's heartbeat instead while cooling down).
    ask: Ask
    epoch: int


@dataclass(frozen=True, slots=True)
class Note:
    """A decision worth an operator's attention, logged by the engine as one sentence."""

    level: int
    event: Event
    sentence: str
    fields: dict[str, Any]


def duplicate_note(election: str, lease: Lease, instance: str) -> Note:
    """Another process holds this node id's lease."""
    sentence = (
        f"election {election}: node id {lease.holder} is held by another process "
        f"(instance {lease.instance or 'unknown'}; this one is {instance}): "
        "either a second daemon runs with this node id (make node ids unique) or this "
        "daemon restarted within one ttl; waiting for that lease to end"
    )
    fields = {"election": election, "term": lease.term, "holder": lease.holder}
    return Note(
        logging.ERROR, Event.DUPLICATE_NODE_ID, sentence, fields | {"instance": lease.instance}
    )


def refused_note(election: str, lease: Lease, high_water: int) -> Note:
    """The backend granted a term this node has already seen."""
    sentence = (
        f"election {election}: the backend granted term {lease.term}, but this node "
        f"already saw term {high_water}: the backend lost acknowledged writes; refusing "
        f"to lead, releasing it and asking for term {high_water + 1} or above"
    )
    fields = {"election": election, "term": lease.term, "high_water": high_water}
    return Note(logging.ERROR, Event.TERM_REFUSED, sentence, fields)
