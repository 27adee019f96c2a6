"""A release whose outcome is unknown (docs/algorithm.md, "A release in doubt").

A release that timed out or lost its connection may have been applied, and may still be
applied later: a proxy, a kernel buffer or a queue can hold it past the moment the engine
gave up. Had this process then renewed the same term and led on it, the late release would
end (or grant away) a lease it believes it holds: two leaders. So after such a release this
process never leads on that term again. While an answer still shows the term as its own, it
does not campaign: it only observes, and releases again (conditioned on the version that
answer carried); once an answer shows the term over (released, another holder, another
term), no late release can match it any more and the process may campaign for a new term.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backends.base import Candidate, Lease


@dataclass
class ReleaseInDoubt:
    """The term of this process's last release whose outcome is unknown; None when none."""

    term: int | None = None

    def on_unknown(self, term: int) -> None:
        """A release of ``term`` failed without saying whether it was applied."""
        self.term = term

    def still_mine(self, lease: Lease, candidate: Candidate) -> bool:
        """Whether ``lease`` still names this process with the term in doubt: not to be led
        on. Only an answer naming another holder, no holder or another term ends the doubt.
        An expired-looking answer does not: etcd reads a live lease with under a second left
        as 0 s, and a keepalive would then renew the very term a late release still matches."""
        named = (lease.holder, lease.instance) == (candidate.node_id, candidate.instance)
        if self.term is not None and not (named and lease.term == self.term):
            self.term = None
        return self.term is not None


def version_of(lease: Lease | None, candidate: Candidate, term: int) -> str:
    """The version a release of ``term`` is conditioned on: the one the last answer showing
    this process holding that term carried; "" if no answer did (the backend then matches
    holder, instance and term alone)."""
    mine = lease is not None and (lease.holder, lease.instance, lease.term) == (
        candidate.node_id,
        candidate.instance,
        term,
    )
    return lease.version if lease is not None and mine else ""
