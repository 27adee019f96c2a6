"""Who may inherit a released lease: the one rule every backend applies in its release's write
(docs/algorithm.md, "One-write hand-over").

A standby receives a granted lease only if it is of another node id than the releaser, is
campaigning, was heard within half of its own ttl, has a priority of 1 or more (0 is a
witness) and passes its health checks ("Who leads"). Half: the grant's expiry counts from
that heartbeat, so the heir is left at least half a ttl to renew, more than its renew
interval (the timing rules keep ttl above twice that). A standby heartbeats every
retry_interval while another holds the lease, well within it. Among those, the highest
priority leads, and of those the freshest. Who is chosen never bears on safety: the heir
self-fences from its own heartbeat.
"""

from __future__ import annotations

from ..backends.asks import Heir
from ..backends.base import Candidate

HEARD_WITHIN_TTLS = 0.5


def heir_of(releaser: Candidate) -> Heir:
    """The heir a release by ``releaser`` may hand its lease to."""
    return Heir(releaser=releaser.node_id, heard_within_ttls=HEARD_WITHIN_TTLS)
