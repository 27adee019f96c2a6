"""The invariants, checked after every step of the loop, each node judged on its own clock:

* at most one node answers "leader" at any instant;
* terms only increase: no leader ever has a term below one already led, nor a term another
  node led;
* a leader's lease is live on the server and names it with that term (what the others'
  safety rests on: the server's record is what the next leader's acquisition consults).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from leaderd.backends.base import Candidate
from leaderd.engine import Election
from leaderd.status import Role

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
    """``members()``: the daemons running now; ``backs(candidate, term)``: the server's truth;
    ``at()``: the virtual time (for messages)."""

    members: Callable[[], Iterable[Member]]
    backs: Callable[[Candidate, int], bool]
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
        if not self.backs(m.election.candidate, term):
            self._fail(f"{who} leads term {term}, but the server's lease is not its, live")
        now_leading[m.name] = term
        self.top_term, self.top_holder = term, who

    def _fail(self, what: str) -> None:
        story = "\n  ".join(self.story)
        raise Violation(f"at {self.at():.4f}: {what}\n  recent:\n  {story}")
