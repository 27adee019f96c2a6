"""The invariants, checked after every step of the loop, each node judged on its own clock:

* at most one node answers "leader" at any instant;
* terms only increase: no leader ever has a term below one already led, nor a term another
  node led;
* a leader's lease, as the server holds it, names it with that term and lasts until the
  leader's own deadline at least (what the others' safety rests on: the server's record is
  what the next leader's acquisition consults). Checked against the deadline, not the
  instant, so that a lease that expires between two steps is seen too.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from leaderd.backends.base import Candidate
from leaderd.election.engine import Election
from leaderd.election.status import Role

from .vloop import NodeClock


class Violation(AssertionError):
    """An invariant failed: the message tells which, when, and the recent leaderships."""


@dataclass
class Member:
    """One running daemon as the checker sees it: its election and its host's clock."""

    name: str
    election: Election
    clock: NodeClock


@dataclass
class Checker:
    """``members()``: the daemons running now; ``lease_until(candidate, term)``: the server's
    truth, until when it keeps that lease (virtual time); ``at()``: the virtual time."""

    members: Callable[[], Iterable[Member]]
    lease_until: Callable[[Candidate, int], float]
    at: Callable[[], float]
    leaderships: int = 0
    top_term: int = 0
    top_holder: str = ""
    leading: dict[str, int] = field(default_factory=dict)  # node -> term, at the last step
    story: deque[str] = field(default_factory=lambda: deque(maxlen=60))

    def step(self) -> None:
        now_leading: dict[str, int] = {}
        for m in self.members():
            now = m.clock.now()
            if not m.election.state.leading(now):
                continue
            view = m.election.state.view(now)
            if view.role is Role.LEADER:
                self._leads(m, view.term, now_leading)
        for name, term in self.leading.items():
            if now_leading.get(name) != term:
                self.story.append(f"{self.at():.4f} {name} stops leading term {term}")
        self.leading = now_leading

    def _leads(self, m: Member, term: int, now_leading: dict[str, int]) -> None:
        instance = m.election.candidate.instance
        who = f"{m.name}/{instance[:6]}"
        if self.leading.get(m.name) != term:
            self.story.append(f"{self.at():.4f} {who} leads term {term}")
            self.leaderships += 1
        if now_leading:
            other, its = next(iter(now_leading.items()))
            self._fail(f"two leaders: {other} (term {its}) and {who} (term {term})")
        if term < self.top_term or (term == self.top_term and who != self.top_holder):
            self._fail(f"{who} leads term {term}, after {self.top_holder} led {self.top_term}")
        deadline = m.clock.virtual(m.election.state.deadline)
        until = self.lease_until(m.election.candidate, term)
        if until < deadline:
            ends = f"ends at {until:.4f}" if until > -math.inf else "is not its"
            self._fail(f"{who} leads term {term} until {deadline:.4f}, but the lease {ends}")
        now_leading[m.name] = term
        self.top_term, self.top_holder = term, who

    def _fail(self, what: str) -> None:
        story = "\n  ".join(self.story)
        raise Violation(f"at {self.at():.4f}: {what}\n  recent:\n  {story}")
