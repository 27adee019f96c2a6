"""The history kept in the election's Lease (``leaderd.io/history``, newest first): each
acquisition ends the open record and starts one, each release ends its own, in the very
update that changes the holder. A holder that is not leaderd (client-go) is not recorded: its
tenure ends inside the record of the leaderd holder before it, which the next leaderd
acquisition ends as taken over."""

from __future__ import annotations

from typing import Any

from ..base import Candidate
from ..records import EndReason, end_of_acquisition
from .codec import Record, tenure_record

History = list[dict[str, Any]]


def acquired(record: Record | None, me: Candidate, term: int, now: str, lost_term: int) -> History:
    """The history after ``me`` acquires ``term`` at ``now`` from ``record``."""
    history = list(record.history) if record is not None else []
    if history and history[0].get("ended") is None:
        last = history[0]
        mine = (last.get("holder"), last.get("instance")) == (me.node_id, me.instance)
        free = record is None or record.holder is None
        lost = mine and bool(lost_term) and last.get("term") == lost_term
        reason = end_of_acquisition(mine, free, lost)
        history[0] = {**last, "ended": now, "reason": reason.value}
    return [tenure_record(me, term, now), *history]


def released(record: Record, term: int, now: str, reason: str) -> History:
    """The history after the holder of ``term`` released it with ``reason``."""
    history = list(record.history)
    if history and history[0].get("term") == term and history[0].get("ended") is None:
        history[0] = {**history[0], "ended": now, "reason": reason}
    return history


def lost(record: Record, me: Candidate, lost_term: int) -> History | None:
    """The history with ``me``'s ``lost_term`` said to have ended for want of the backend;
    None when there is nothing to change (it is not ended yet, or says so already)."""
    history = list(record.history)
    for i, r in enumerate(history):
        if (r.get("term"), r.get("holder"), r.get("instance")) != (
            lost_term,
            me.node_id,
            me.instance,
        ):
            continue
        ended = r.get("reason") in (EndReason.EXPIRED.value, EndReason.TAKEN_OVER.value)
        if not ended:
            return None
        history[i] = {**r, "reason": EndReason.LOST_BACKEND.value}
        return history
    return None
