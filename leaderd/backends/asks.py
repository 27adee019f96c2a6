"""What the engine asks of a backend, as values: an acquire-or-renew (``Ask``) and a release
(``Release``), with the standby a release may hand the lease to (``Heir``).

The engine's rules make them (leaderd/election/); a backend applies them inside its own
atomic write and decides nothing of its own: which term is the least it may take, which
version it may take over, and who may inherit a released lease are all said here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import Candidate
from .records import EndReason


@dataclass(frozen=True, slots=True)
class Ask:
    """Take or extend ``candidate``'s lease on ``election`` for ``ttl`` seconds of the
    backend's clock (Backend.acquire_or_renew says when it may)."""

    election: str
    candidate: Candidate
    ttl: float
    # Give up after this many seconds: what is left before the asker's deadline.
    timeout: float
    # A backend that can wait inside the request for a held lease (a blocking advisory lock)
    # may block this long; lease backends ignore it.
    wait: float = 0.0
    # The version of an unreleased lease the asker watched unchanged for one ttl on its own
    # clock; "" takes over nothing (docs/algorithm.md, rule 4).
    takeover: str = ""
    # The least term an acquisition may take: the asker's high-water mark + 1.
    min_term: int = 0
    # A term the asker stepped down from unable to reach the backend: its history record,
    # once ended, says "lost the backend".
    lost_term: int = 0


@dataclass(frozen=True, slots=True)
class Heir:
    """Who may receive a released lease in the release's own write (docs/algorithm.md,
    "One-write hand-over" and "Who leads"): a campaigning member of another node id than
    ``releaser``, heard within ``heard_within_ttls`` of its own ttl, of priority at least
    ``min_priority`` and, if ``healthy``, whose health checks pass; of them the highest
    priority, then the freshest, ties by node id and instance. Only the choice is here: the
    grant's expiry counts from the heir's heartbeat, so who is chosen never bears on safety."""

    releaser: str
    heard_within_ttls: float
    min_priority: int = 1  # 0 is a witness's: it never leads
    healthy: bool = True

    def may_inherit(
        self, node_id: str, heard_ago: float, ttl: float, priority: int = 1, health: str = ""
    ) -> bool:
        """For a backend that chooses in Python (etcd) what the others write in SQL."""
        return (
            node_id != self.releaser
            and heard_ago < ttl * self.heard_within_ttls
            and priority >= self.min_priority
            and not (self.healthy and health)
        )

    def params(self) -> dict[str, Any]:
        """The rule as a SQL statement's named parameters (:releaser, :heard_within_ttls,
        :min_priority, :healthy)."""
        return {"releaser": self.releaser, "heard_within_ttls": self.heard_within_ttls,
                "min_priority": self.min_priority, "healthy": self.healthy}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Release:
    """End ``candidate``'s ``term`` (Backend.release says how), recording ``reason``."""

    election: str
    candidate: Candidate
    term: int
    # An EndReason, or a sentence of the engine's ("handed over: leader unhealthy (...)").
    reason: EndReason | str = EndReason.RELEASED
    # The version last answered to the releaser; "" for any. A release that lands after a
    # renewal of the same term then changes nothing (docs/algorithm.md, "A release in doubt").
    version: str = ""
    # A switchover: the free lease is reserved for this node id for ``ttl`` seconds.
    reserve_for: str = ""
    ttl: float = 0.0
    # Without a reservation, on a backend that GRANTS: the lease goes to this heir, if any.
    heir: Heir | None = None
