"""A leader key etcd deleted without its holder's release: its lease expired or was revoked
(etcd can revoke one that is kept alive), or the key was removed by hand. No standby of this
daemon takes it before the old holder's self-fence deadline has surely passed (docs/etcd.md,
"A lease etcd revokes while it is kept alive").

The holder's deadline is at most one ttl after the send of its last successful keepalive;
the round that sent it also put the holder's member key (its heartbeat), and the round
counts only if that put succeeded. This daemon saw the put after it was sent, so one ttl
after this daemon last saw the holder's member key change, on its own CLOCK_BOOTTIME, that
deadline is past. A crashed holder's key is deleted by etcd's lessor one ttl after its last
keepalive: the wait is then over, or nearly, when the deletion is seen. A release deletes
the key and puts its ``ended`` record in one transaction (one revision): no wait.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...clock import boottime
from ..base import Candidate
from ..records import Member
from .records import Keys, MemberClock
from .state import Holder


@dataclass
class Fence:
    """The last deletion of the leader key that no release explained, as this daemon saw it."""

    revision: int = 0  # the revision that deleted the key; 0: none pending
    holder: tuple[str, str] = ("", "")  # the node id and instance whose key it was
    seen_at: float = -math.inf  # CLOCK_BOOTTIME when this daemon last saw that holder alive
    explained: int = 0  # the revision of the last release record seen, in either order

    def deleted(self, holder: Holder, revision: int, clock: MemberClock, keys: Keys) -> None:
        """``holder``'s key was deleted at ``revision``: its last sign of life is its member
        key's last change; never seen, the deletion itself (the safe side)."""
        if revision == self.explained:
            return
        age = clock.age(keys.member(Candidate(holder.node_id, "", holder.instance)))
        self.revision, self.holder = revision, (holder.node_id, holder.instance)
        self.seen_at = boottime() - (0.0 if age is None else age)

    def released(self, revision: int) -> None:
        """An ``ended`` record put at ``revision``: a deletion at that revision was a release."""
        self.explained = revision
        if revision == self.revision:
            self.clear()

    def clear(self) -> None:
        self.revision = 0

    def left(self, me: Candidate, ttl: float, members: tuple[Member, ...]) -> float:
        """Seconds before ``me`` may take the key (0: now); its own old key never waits (its
        process knows it no longer holds it). The holder's ttl is its member key's; the
        asker's ``ttl`` stands in while that is unknown."""
        if not self.revision or self.holder == (me.node_id, me.instance):
            return 0.0
        ttls = [m.ttl for m in members if (m.node_id, m.instance) == self.holder]
        return max(0.0, self.seen_at + max(ttls, default=ttl) - boottime())
