"""What the etcd backend knows of each election, and how it reads, remembers and answers it:
the state of the election's keys as its last answer and the watch left them, members and
candidates, and the ``Lease`` each answer is made of (backend.py holds the interface)."""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
from dataclasses import replace
from typing import Any

from ..base import (
    BackendError,
    BackendUnavailable,
    Candidate,
    Lease,
)
from ..records import Member
from .gateway import EtcdClient, EtcdSettings, b64, unb64
from .grant import Offers
from .records import Keys, MemberClock, now
from .state import Holder as _Holder
from .state import Round, reservation
from .state import Spare as _Spare
from .state import State as _State
from .state import compare as _compare
from .state import holder_of as _holder
from .state import int_of as _int
from .state import revision_of as _revision
from .state import when as _when
from .watch import PrefixWatch

DEFAULT_TIMEOUT = 5.0  # observe and release have no timeout argument
LEASE_NOT_FOUND = 5  # gRPC NOT_FOUND: "etcdserver: requested lease not found"
_LESSOR_SWEEP = 0.5  # how often etcd's lessor deletes the keys of expired leases


class EtcdView:
    """The per-election state of one etcd backend, and its reads and answers."""

    def __init__(self, settings: EtcdSettings) -> None:
        self._settings = settings
        self._etcd = EtcdClient(settings)
        self._prefix = settings.prefix
        self._states: dict[str, _State] = {}
        self._answered: dict[str, int] = {}  # revision of the last answer, by election
        self._named: dict[str, tuple[str, str, int] | None] = {}  # the holder it named
        self._held: dict[str, int] = {}  # the mod revision of our key, as the last answer said
        # A watch event that woke the engine named another holder since that answer: only
        # the round it wakes skips the read (a cached holder alone may be a lagging event).
        self._news: set[str] = set()
        self._answers = itertools.count(1)
        self._spares: dict[str, _Spare] = {}  # never revoked: an unused lease ends by itself
        self._watch = PrefixWatch(self._etcd, self._prefix, self._on_event)
        self._members: dict[str, tuple[Member, ...]] = {}  # as the last answer listed them
        self._member_clock = MemberClock()
        self._last_heard_at = dt.datetime.min.replace(tzinfo=dt.UTC)
        self._me: dict[str, Candidate] = {}  # who asks, by election: whom a grant is for
        self._offers = Offers()

    async def _read(self, election: str, timeout: float, ask: Round | None = None) -> _State:
        """The keys of an election and its members, in one transaction (one revision);
        with ``ask``, that member's heartbeat too."""
        names = (self._key(election), self._term_key(election), self._reserved_key(election))
        ranges = [{"request_range": {"key": b64(name)}} for name in names]
        keys = self._keys(election)
        spare = self._spares.get(election)
        ranges += [*self._heard(ask, spare), keys.list_members(), keys.list_candidates()]
        answer = await self._call("/v3/kv/txn", {"success": ranges}, timeout, "reading the lease")
        self._note_members(election, answer, ask.me if ask else None)
        self._note_offers(election, answer)
        await self._prune(election, max(0.001, timeout / 2))
        return self._remember(election, self._parse(answer))

    def _heard(self, ask: Round | None, spare: _Spare | None = None) -> list[dict[str, Any]]:
        """The operations of a member's heartbeat (and of a term it lost etcd in), and of
        its candidacy: withdrawn when not campaigning, else offering ``spare``."""
        if ask is None:
            return []
        keys = self._keys(ask.election)
        lost = [keys.lost(ask.lost_term)] if ask.lost_term else []
        heard = keys.heard(ask.me, ask.ttl, ask.heard_at, ask.campaigning)
        return [heard, *lost, *self._offer(ask, spare)]

    def _offer(self, ask: Round, spare: _Spare | None) -> list[dict[str, Any]]:
        """Withdraw the candidacy when not campaigning; offer a spare the candidate key does
        not name yet, kept alive by a known round (grant.py)."""
        me, keys = ask.me, self._keys(ask.election)
        if not ask.campaigning:
            return [keys.withdraw(me)]
        state = self._states.get(ask.election)
        if spare is None or spare.kept_in is None or spare.left() <= 0:
            return []
        if state is not None and mine(state, me):
            return []
        offered = self._offers.of(ask.election).get((me.node_id, me.instance))
        if offered is not None and offered.lease == spare.id:
            return []
        return [keys.stand(me, spare.id)]

    def _heard_at(self) -> str:
        """The wall clock in milliseconds, made strictly increasing: a grant names the round
        it counts from by it, so no two rounds of this process may share one."""
        stamp = dt.datetime.fromisoformat(now())
        if stamp <= self._last_heard_at:
            stamp = self._last_heard_at + dt.timedelta(milliseconds=1)
        self._last_heard_at = stamp
        return stamp.isoformat(timespec="milliseconds")

    def _note_offers(self, election: str, answer: Any) -> None:
        self._offers.read(election, self._keys(election), answer, _revision(answer))

    def _note_members(self, election: str, answer: Any, me: Candidate | None) -> None:
        keys = self._keys(election)
        self._members[election] = self._member_clock.members(keys.listed(answer), me, keys)

    async def _prune(self, election: str, timeout: float) -> None:
        """Delete the members silent for long, each only if still unchanged (rare: one
        request per member that went away)."""
        keys = self._keys(election)
        for key, revision in self._member_clock.silent(self._members.get(election, ()), keys):
            offered = key.replace(keys.members, keys.candidates, 1)  # its candidacy goes too
            body = {"compare": [_compare(b64(key), "MOD", revision)],
                    "success": [{"request_delete_range": {"key": b64(k)}}
                                for k in (key, offered)]}  # fmt: skip
            with contextlib.suppress(BackendError):
                await self._call("/v3/kv/txn", body, timeout, "pruning a member")

    def _parse(self, answer: Any) -> _State:
        """The leader, term and reserved keys' ranges of a transaction (missing ones read as
        absent)."""
        kvs: list[dict[str, Any]] = [
            (r.get("response_range", {}).get("kvs") or [{}])[0] for r in answer.get("responses", [])
        ]
        leader, term, reserved = [*kvs, {}, {}, {}][:3]
        holder = _holder(leader) if leader else None
        stored = _int(unb64(term.get("value", "")).decode(errors="replace"))
        held, modified = holder.term if holder else 0, _int(term.get("mod_revision"))
        return _State(_revision(answer), holder, max(stored, held), modified, reservation(reserved))

    def _remember(self, election: str, state: _State) -> _State:
        known = self._states.get(election)
        if known is None or state.revision >= known.revision:
            self._states[election] = state
        return state

    async def _reserved_answer(self, election: str, state: _State, timeout: float) -> Lease:
        """A free lease, with what is left of its reservation (etcd's lessor's count)."""
        if not state.reserved.node_id:
            return self._answer(election, state, None)
        body = {"ID": state.reserved.lease}
        lease = await self._call("/v3/kv/lease/timetolive", body, timeout, "reading it")
        # -1: expired, but its key lasts until the lessor's next sweep (its deletion is an
        # event that wakes every waiter): reserved for a moment more.
        left = max(float(lease.get("TTL", -1)), _LESSOR_SWEEP)
        return self._answer(election, state, None, left)

    def _answer(
        self, election: str, state: _State, expires_in: float | None, reserved_in: float = 0.0
    ) -> Lease:
        self._answered[election] = max(self._answered.get(election, 0), state.revision)
        holder, members = state.holder, self._members.get(election, ())
        self._news.discard(election)
        self._named[election] = None if holder is None else named(holder)
        me = self._me.get(election)
        if holder is not None and me is not None and mine(state, me):
            self._held[election] = holder.modified  # what a watch event can prove gone
        else:
            self._held.pop(election, None)
        if holder is None:
            to = state.reserved.node_id if reserved_in > 0 else ""
            return Lease(election, None, "", state.term, None, None, reserved_for=to,
                         reserved_in=reserved_in if to else 0.0, members=members)  # fmt: skip
        # Every answer that finds the key is a new version: proof that etcd keeps the lease alive
        # (its lessor deletes the key otherwise), so the engine never waits to take it over.
        version = f"{holder.modified}.{next(self._answers)}"
        return Lease(election, holder.node_id, holder.address, holder.term,
                     _when(holder.acquired_at), expires_in, instance=holder.instance,
                     version=version, members=members)  # fmt: skip

    def _on_event(self, key: str, kv: dict[str, Any] | None, revision: int) -> str | None:
        """A watch event (kv None: deleted): update what we know; the election it concerns."""
        election, _, what = key[len(self._prefix) :].partition("/")
        if what.startswith("candidates/"):  # a leader's release reads the offers of the moment
            self._offers.event(election, self._keys(election), key, kv, revision)
        elif what.startswith("members/") and kv is not None:  # their age too
            self._member_clock.saw(key, revision)
        if what not in ("leader", "term", "reserved"):
            return None
        known = self._states.get(election)
        if known is None or revision < known.revision:
            return election
        if what == "leader":
            holder = None if kv is None else _holder(kv)
            self._states[election] = replace(known, revision=revision, holder=holder)
        elif what == "reserved":
            self._states[election] = replace(known, revision=revision, reserved=reservation(kv))
        elif kv is not None:
            term = _int(unb64(kv.get("value", "")).decode(errors="replace"))
            self._states[election] = replace(
                known, revision=revision, term=term, term_modified=revision
            )
        return election

    async def _call(self, path: str, body: dict[str, Any], timeout: float, doing: str) -> Any:
        if timeout <= 0:
            raise BackendUnavailable(f"{doing}: no time left")
        return await self._etcd.call(path, body, timeout, doing)

    def _keys(self, election: str) -> Keys:
        return Keys(f"{self._prefix}{election}/")

    def _key(self, election: str) -> str:
        return self._keys(election).leader

    def _term_key(self, election: str) -> str:
        return self._keys(election).term

    def _reserved_key(self, election: str) -> str:
        return f"{self._prefix}{election}/reserved"


def theirs(state: _State, me: Candidate) -> bool:
    return state.holder is not None and not mine(state, me)


def named(holder: _Holder) -> tuple[str, str, int]:
    return holder.node_id, holder.instance, holder.term


def mine(state: _State, me: Candidate) -> bool:
    holder = state.holder
    return holder is not None and (holder.node_id, holder.instance) == (me.node_id, me.instance)
