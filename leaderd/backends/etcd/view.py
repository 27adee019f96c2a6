"""How the etcd backend reads an election and answers: one ``EtcdElection`` per election
(election.py) that its reads and the watch's events keep up to date, and the ``Lease`` each
answer is made of (backend.py holds the interface)."""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
from typing import Any

from ..base import BackendError, BackendUnavailable, Lease
from .election import EtcdElection
from .gateway import EtcdClient, EtcdSettings
from .line import ReleaseLine
from .records import Keys, now
from .state import Round, State, state_of
from .transactions import prune_txn, read_txn
from .watch import PrefixWatch

DEFAULT_TIMEOUT = 5.0  # observe and release have no timeout argument
LEASE_NOT_FOUND = 5  # gRPC NOT_FOUND: "etcdserver: requested lease not found"
_LESSOR_SWEEP = 0.5  # how often etcd's lessor deletes the keys of expired leases
_WATCHED = ("leader", "term", "reserved")  # the keys whose events change an election's state


class EtcdView:
    """The elections one etcd backend knows, and its reads and answers."""

    def __init__(self, settings: EtcdSettings) -> None:
        self._settings = settings
        self._etcd = EtcdClient(settings)
        self._line = ReleaseLine(self._etcd)  # a release's own connection (line.py)
        self._prefix = settings.prefix
        self._elections: dict[str, EtcdElection] = {}
        self._answers = itertools.count(1)
        self._watch = PrefixWatch(self._etcd, self._prefix, self._on_event)
        self._last_heard_at = dt.datetime.min.replace(tzinfo=dt.UTC)

    def _election(self, name: str) -> EtcdElection:
        """What is known of the election ``name``: nothing yet the first time."""
        known = self._elections.get(name)
        if known is None:
            known = self._elections[name] = EtcdElection(name, Keys(f"{self._prefix}{name}/"))
        return known

    async def _read(self, e: EtcdElection, timeout: float, ask: Round | None = None) -> State:
        """The keys of an election and its members, in one transaction (one revision);
        with ``ask``, that member's heartbeat too, and in its holder's first renewal of a
        term the trimming of the history."""
        trim = e.trim_due(ask.me) if ask is not None else None
        body = read_txn(e, ask, trim)
        answer = await self._call("/v3/kv/txn", body, timeout, "reading the lease")
        e.trimmed = max(e.trimmed, trim or 0)
        e.heard_members(answer, ask.me if ask else None)
        e.heard_offers(answer)
        await self._prune(e, max(0.001, timeout / 2))
        known = e.known_holder
        released = known is not None and e.keys.released_in(answer, known.term)
        return e.remember(state_of(answer), released_by_known=released)

    def _heard_at(self) -> str:
        """The wall clock in milliseconds, made strictly increasing: a grant names the round
        it counts from by it, so no two rounds of this process may share one."""
        stamp = dt.datetime.fromisoformat(now())
        if stamp <= self._last_heard_at:
            stamp = self._last_heard_at + dt.timedelta(milliseconds=1)
        self._last_heard_at = stamp
        return stamp.isoformat(timespec="milliseconds")

    async def _prune(self, e: EtcdElection, timeout: float) -> None:
        """Delete the members silent for long, each only if still unchanged (rare: one
        request per member that went away)."""
        for key, revision in e.clock.silent(e.members, e.keys):
            with contextlib.suppress(BackendError):
                await self._call("/v3/kv/txn", prune_txn(e.keys, key, revision), timeout,
                                 "pruning a member")  # fmt: skip

    async def _reserved_answer(self, e: EtcdElection, state: State, timeout: float) -> Lease:
        """A free lease, with what is left of its reservation (etcd's lessor's count)."""
        if not state.reserved.node_id:
            return self._answer(e, state, None)
        body = {"ID": state.reserved.lease}
        lease = await self._call("/v3/kv/lease/timetolive", body, timeout, "reading it")
        # -1: expired, but its key lasts until the lessor's next sweep (its deletion is an
        # event that wakes every waiter): reserved for a moment more.
        left = max(float(lease.get("TTL", -1)), _LESSOR_SWEEP)
        return self._answer(e, state, None, left)

    def _answer(
        self, e: EtcdElection, state: State, expires_in: float | None, reserved_in: float = 0.0
    ) -> Lease:
        return e.answer(state, expires_in, self._answers, reserved_in)

    def _on_event(self, key: str, kv: dict[str, Any] | None, revision: int) -> str | None:
        """A watch event (kv None: deleted): update what we know; the election it concerns."""
        name, _, what = key[len(self._prefix) :].partition("/")
        if what.startswith("candidates/"):  # a leader's release reads the offers of the moment
            e = self._election(name)
            e.offers.event(e.keys, key, kv, revision)
        elif what.startswith("members/") and kv is not None:  # their age too
            self._election(name).clock.saw(key, revision)
        elif what.startswith("ended/") and kv is not None:  # a release: no fence to wait out
            self._election(name).fence.released(revision)
        if what not in _WATCHED:
            return None
        self._election(name).saw(what, kv, revision)
        return name

    async def _call(self, path: str, body: dict[str, Any], timeout: float, doing: str) -> Any:
        if timeout <= 0:
            raise BackendUnavailable(f"{doing}: no time left")
        return await self._etcd.call(path, body, timeout, doing)
