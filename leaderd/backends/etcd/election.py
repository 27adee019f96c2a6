"""What the etcd backend knows of one election (docs/etcd.md): the state of its keys as its
last answer and the watch left them, who asks in it, its spare, its members and the
candidates' offers, and how far its answers and the watch's news have gone. One object per
election: each call of the backend looks it up once, by the election's name."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from ..base import Candidate, Lease, LeaseLost
from ..records import Member
from .fence import Fence
from .grant import Offers
from .records import Keys, MemberClock
from .state import (
    Holder,
    Spare,
    State,
    holder_of,
    mine,
    named,
    reservation,
    revision_of,
    term_of,
    when,
)


@dataclass(eq=False)
class EtcdElection:
    """One election as this backend knows it; mutable, touched by its calls and the watch."""

    name: str
    keys: Keys
    state: State | None = None  # the newest of an answer's read and the watch's events
    asker: Candidate | None = None  # who asks in it: whom a grant is for
    spare: Spare | None = None  # never revoked: an unused etcd lease ends by itself
    members: tuple[Member, ...] = ()  # as the last answer listed them
    clock: MemberClock = field(default_factory=MemberClock)  # the members' ages
    offers: Offers = field(default_factory=Offers)  # the candidates' spares
    answered: int = 0  # the revision of the last answer
    named: tuple[str, str, int] | None = None  # the holder the last answer named
    held: int | None = None  # the mod revision of our key, as the last answer said
    # A watch event that woke the engine named another holder since that answer: only
    # the round it wakes skips the read (a cached holder alone may be a lagging event).
    news: bool = False
    fence: Fence = field(default_factory=Fence)  # a deletion no release explained (fence.py)
    trimmed: int = 0  # the last term whose old history records this node deleted

    def trim_due(self, me: Candidate) -> int | None:
        """Our term, while its history is untrimmed (a grant does not trim it): its holder's
        first renewal trims it (records.Keys.trimmed)."""
        holder = self.known_holder
        if self.state is None or holder is None or not mine(self.state, me):
            return None
        return holder.term if holder.term > self.trimmed else None

    @property
    def known_holder(self) -> Holder | None:
        """The holder that what is known names; None: free, or nothing known yet."""
        return self.state.holder if self.state is not None else None

    def remember(self, state: State, released_by_known: bool = False) -> State:
        """Keep ``state`` unless what is known is newer; the state read, either way.
        ``released_by_known``: the same read holds the known holder's release record."""
        if self.state is None or state.revision >= self.state.revision:
            known = self.known_holder
            # Its release, with no term since: the deletion is explained, as by the watch.
            if not (released_by_known and known is not None and state.term == known.term):
                self.holder_went(state.holder, state.revision)
            self.state = state
        return state

    def holder_went(self, holder: Holder | None, revision: int) -> None:
        """The leader key is as ``holder`` at ``revision``: a deletion of a known holder's
        key fences it until a release record at that revision explains it (fence.py)."""
        known = self.state
        if holder is not None:
            self.fence.clear()
        elif known is not None and known.holder is not None and revision > known.revision:
            self.fence.deleted(known.holder, revision, self.clock, self.keys)

    def heard_members(self, answer: Any, me: Candidate | None) -> None:
        """The member keys a transaction's ranges returned."""
        self.members = self.clock.members(self.keys.listed(answer), me, self.keys)

    def heard_offers(self, answer: Any) -> None:
        """The candidate keys a transaction's ranges returned."""
        self.offers.read(self.keys, answer, revision_of(answer))

    def fenced(self, me: Candidate, ttl: float) -> float:
        """Seconds ``me`` must still wait before taking the free key (fence.py)."""
        return self.fence.left(me, ttl, self.members)

    def saw(self, what: str, kv: dict[str, Any] | None, revision: int) -> None:
        """A watch event on the leader, term or reserved key (kv None: deleted)."""
        known = self.state
        if known is None or revision < known.revision:
            return
        if what == "leader":
            holder = None if kv is None else holder_of(kv)
            self.holder_went(holder, revision)
            self.state = replace(known, revision=revision, holder=holder)
        elif what == "reserved":
            self.state = replace(known, revision=revision, reserved=reservation(kv))
        elif kv is not None:
            term = term_of(kv)
            self.state = replace(known, revision=revision, term=term, term_modified=revision)

    def answer(
        self, state: State, expires_in: float | None, answers: Iterator[int], reserved_in: float
    ) -> Lease:
        """The ``Lease`` an answer says, noted as this election's last answer; ``answers``
        numbers the answers that find the key."""
        self.answered = max(self.answered, state.revision)
        holder, me = state.holder, self.asker
        self.news = False
        self.named = None if holder is None else named(holder)
        mine_now = holder is not None and me is not None and mine(state, me)
        self.held = holder.modified if holder is not None and mine_now else None
        if holder is None:
            to = state.reserved.node_id if reserved_in > 0 else ""
            return Lease(self.name, None, "", state.term, None, None, reserved_for=to,
                         reserved_in=reserved_in if to else 0.0, members=self.members)  # fmt: skip
        # Every answer that finds the key is a new version: proof that etcd keeps the lease alive
        # (its lessor deletes the key otherwise), so the engine never waits to take it over.
        version = f"{holder.modified}.{next(answers)}"
        return Lease(self.name, holder.node_id, holder.address, holder.term,
                     when(holder.acquired_at), expires_in, instance=holder.instance,
                     version=version, members=self.members)  # fmt: skip

    def granted_spare(self) -> Spare | None:
        """Our spare, if a release put the key under it while a known round kept it alive: it
        is our lease now, no longer a spare."""
        state, me, spare = self.state, self.asker, self.spare
        if state is None or me is None or spare is None or spare.kept_in is None:
            return None
        if state.holder is None or not mine(state, me) or state.holder.lease != spare.id:
            return None
        self.spare = None
        return spare

    def check_held(self) -> None:
        """Raise LeaseLost if etcd, as the watch tells it, no longer has our key as our last
        answer saw it: deleted (its lease revoked, or the key removed by hand) or put by
        another. A successor takes a key etcd deleted only once our deadline has surely
        passed (fence.py): stepping down here is early, not what keeps one leader."""
        held, state = self.held, self.state
        if held is None or state is None or state.revision <= held:
            return
        holder = state.holder
        if holder is not None and holder.modified == held:
            return
        self.held = None
        if holder is None:
            raise LeaseLost(
                f"etcd deleted the leader key at revision {state.revision}: "
                "its lease was revoked, or the key removed by hand"
            )
        raise LeaseLost(
            f"etcd gave the leader key to {holder.node_id} (term {holder.term}) "
            f"at revision {holder.modified}"
        )

    def note_news(self) -> None:
        """The watch named a holder other than us and other than the last answer's."""
        state, me = self.state, self.asker
        if state is None or me is None or state.holder is None or mine(state, me):
            return
        if named(state.holder) != self.named:
            self.news = True
