"""This process's heartbeats that its own requests wrote and had answered, each with the
send time of its request: a grant is led on only from there (docs/algorithm.md, "Only a
request's own answer makes a leader", and "One-write hand-over").

A heartbeat is filed only from ``Lease.heartbeat``, which the backend sets to the stamp the
very request it answers wrote. A stamp merely listed among the members (written by an
earlier request whose answer never came, and answered now from a cache) is not filed: a
grant naming it may count from a keepalive sent before this send time, and the node would
lead past the end of the lease it was granted.
"""

from __future__ import annotations

import datetime as dt

from ..backends.base import Lease

KEPT = 8  # own answered heartbeats a grant may count from (newest kept)


class Heartbeats:
    """Heartbeat stamp (the backend's, records.Member.heard_at) -> its request's send time."""

    def __init__(self) -> None:
        self.sent: dict[dt.datetime, float] = {}

    def note(self, lease: Lease, t_send: float) -> None:
        """File the heartbeat of the request sent at ``t_send`` that answered ``lease``."""
        if lease.cached or lease.heartbeat is None:
            return
        # The earliest send: two requests may name one instant (a stamp in milliseconds);
        # counting from the first is safe.
        self.sent.setdefault(lease.heartbeat, t_send)
        while len(self.sent) > KEPT:
            del self.sent[next(iter(self.sent))]

    def sent_at(self, heard_at: dt.datetime) -> float | None:
        """The send time of the request that wrote ``heard_at``; None: none of ours we saw
        answered (a grant naming it is checked with a round)."""
        return self.sent.get(heard_at)
