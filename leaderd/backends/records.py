"""What a backend keeps besides the lease: the members it has heard from, and the history of
holders (docs/api.md, "Members" and "History"; docs/operations.md, "Who led at 03:12").

Both ride on requests the engine already sends: a member is registered by each
acquire-or-renew (and by an observe that names its candidate), and a history record is
written in the transaction that changes the holder, where the backend allows it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum

# A member not heard from for this many of its own ttls is deleted by the next request.
PRUNE_AFTER_TTLS = 10
# History records kept per election: the newest ones (a bounded table or key range).
HISTORY_RETENTION = 100
# The ttl of a stopping member's last heartbeat: it is stale at once, so no switchover picks
# it, and pruned by the next request.
LEFT_TTL = 0.0
# Between an end reason and the notes on the term that follow it (election/term_notes.py).
NOTE_SEPARATOR = "; "


class EndReason(StrEnum):
    """How a holder's term ended (a history record's ``end_reason``)."""

    RELEASED = "released"  # the holder released it (stop, or a command that exited)
    RESIGNED = "resigned"  # the holder released it on POST /resign
    HANDED_OVER = "handed over to"  # ... NODE: released on POST /resign?to=NODE (a switchover)
    EXPIRED = "expired"  # it lapsed; its holder (or etcd's lessor) let it go by itself
    TAKEN_OVER = "taken over after expiry"  # another holder took the lapsed lease
    HOLDER_DIED = "holder died"  # its process died: the kernel freed its holder lock (SQLite)
    LOST_BACKEND = "lost the backend"  # the holder stepped down unable to reach the backend


@dataclass(frozen=True, slots=True)
class Member:
    """One daemon process (node id and instance) that takes part in an election."""

    node_id: str
    instance: str
    address: str
    # The daemon's leaderd version, "" when unknown.
    version: str
    # The member's own ttl: it is stale once not heard from for that long.
    ttl: float
    # When the backend last heard from it, on the backend's clock (display only).
    heard_at: dt.datetime | None
    # Seconds between that and the answer that listed it, judged by the backend's clock
    # (or, etcd, by this daemon's own clock since it saw the member's key change).
    heard_ago: float
    # Its last heartbeat asked for the lease (a grant may go to it).
    campaigning: bool = False
    # Its priority (0: a witness), and why its health checks fail ("" while they pass).
    priority: int = 1
    health: str = ""
    # The switchover it asks for ("" for none): the leader acts on it (docs/api.md).
    switchover: str = ""


@dataclass(frozen=True, slots=True)
class Tenure:
    """One history record: one holder's term, from acquisition to its end."""

    election: str
    term: int
    holder: str
    instance: str
    address: str
    acquired_at: dt.datetime | None
    ended_at: dt.datetime | None  # None while it lasts
    end_reason: str | None  # an EndReason value; None while it lasts


class NotedReason(str):
    """An end reason followed by notes on the term (election/term_notes.py), as one text:
    "resigned; on_elected hook failed with status 3". ``notes`` keeps them apart."""

    notes: str

    def __new__(cls, reason: str, notes: str) -> NotedReason:
        text = super().__new__(cls, f"{reason}{NOTE_SEPARATOR}{notes}" if notes else reason)
        text.notes = notes
        return text


def end_text(reason: EndReason | str, reserve_for: str) -> str:
    """The end_reason a release records: a switchover names the node it reserved the lease
    for ("handed over to NODE"; older records say "resigned"), keeping the term's notes."""
    if not reserve_for:
        return str(reason)
    notes = getattr(reason, "notes", "")
    return str(NotedReason(f"{EndReason.HANDED_OVER.value} {reserve_for}", notes))


def end_of_acquisition(mine: bool, free: bool, lost: bool) -> EndReason:
    """How the previous term ended when a new acquisition replaces it: ``mine`` (this very
    process held it), ``free`` (it was released), ``lost`` (this process stepped down from
    it unable to reach the backend)."""
    if free:
        return EndReason.RELEASED
    if mine:
        return EndReason.LOST_BACKEND if lost else EndReason.EXPIRED
    return EndReason.TAKEN_OVER
