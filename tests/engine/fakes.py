"""The engine tests' backend: it records calls (its clocks are clocks.py's).

The backend keeps its leases in a ``LeaseStore`` judged on the fake clock (a lease
expires at the time it was acquired or renewed plus its ttl); several backends may
share one store to play several nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from leaderd.backends.asks import Ask, Heir, Release
from leaderd.backends.base import (
    Backend,
    BackendUnavailable,
    Candidate,
    Capabilities,
    Capability,
    Grant,
    Lease,
    LeaseLost,
    heard_in,
)
from leaderd.backends.records import EndReason, Member, Tenure

from .clocks import Clock


@dataclass
class Row:
    holder: str | None = None
    instance: str = ""
    address: str = ""
    term: int = 0
    acquired_at: dt.datetime | None = None
    expires_at: float = 0.0
    version: int = 0
    reserved_for: str = ""
    reserved_until: float = 0.0


class LeaseStore:
    """The shared lease table: what a real database would hold, judged on ``clock``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.rows: dict[str, Row] = {}
        self.changed = asyncio.Event()
        # Members: (node id, instance) -> when last heard (wall clock), campaigning, ttl.
        self.heard: dict[tuple[str, str], tuple[dt.datetime, bool, float]] = {}
        self.last_grant: Grant | None = None

    def hear(self, candidate: Candidate, campaigning: bool, ttl: float) -> tuple[Member, ...]:
        """Register a heartbeat; the members list names only the one just heard."""
        at = self.clock.wall()
        self.heard[candidate.node_id, candidate.instance] = (at, campaigning, ttl)
        c = candidate
        return (Member(c.node_id, c.instance, c.address, c.leaderd_version, ttl, at, 0.0),)

    def lease(self, election: str) -> Lease:
        row = self.rows.setdefault(election, Row())
        if row.holder is None:
            left = row.reserved_until - self.clock.now()
            to = row.reserved_for if left > 0 else ""
            return Lease(election, None, "", row.term, None, None, reserved_for=to,
                         reserved_in=left if to else 0.0)  # fmt: skip
        expires_in = max(0.0, row.expires_at - self.clock.now())
        return Lease(
            election,
            row.holder,
            row.address,
            row.term,
            row.acquired_at,
            expires_in,
            instance=row.instance,
            version=str(row.version),
        )

    def take(
        self,
        election: str,
        candidate: Candidate,
        ttl: float,
        takeover: str = "",
        min_term: int = 0,
    ) -> Lease:
        """The backend contract (base.py): renew, take a free lease, or take over an
        expired one whose version the caller names; else change nothing."""
        self.lease(election)
        row = self.rows[election]
        now = self.clock.now()
        mine = row.holder == candidate.node_id and row.instance == candidate.instance
        expired = row.holder is not None and now >= row.expires_at
        if mine and not expired:
            row.expires_at, row.version = now + ttl, row.version + 1
        elif (
            (row.holder is None and not self.lease(election).reserved_against(candidate))
            or mine
            or (expired and takeover == str(row.version))
        ):
            row.holder, row.instance = candidate.node_id, candidate.instance
            row.address, row.term = candidate.address, max(row.term + 1, min_term)
            row.acquired_at, row.expires_at = self.clock.wall(), now + ttl
            row.version, row.reserved_for = row.version + 1, ""
            self._wake()
        return self.lease(election)

    def release(
        self,
        election: str,
        candidate: Candidate,
        term: int,
        reserve_for: str = "",
        ttl: float = 0,
        heir: Heir | None = None,
    ) -> None:
        row = self.rows.setdefault(election, Row())
        mine = row.holder == candidate.node_id and row.instance == candidate.instance
        if mine and row.term == term:
            row.holder, row.instance, row.address, row.acquired_at = None, "", "", None
            row.reserved_for, row.reserved_until = reserve_for, self.clock.now() + ttl
            row.version += 1
            if heir is not None and not reserve_for:
                self._grant(election, row, heir)
            self._wake()

    def _grant(self, election: str, row: Row, heir: Heir) -> None:
        """base.py's grant: the freshest campaigning member ``heir`` allows gets term + 1
        until its ttl after it was heard."""
        wall = self.clock.wall()
        live = [
            (at, node, instance, ttl)
            for (node, instance), (at, campaigning, ttl) in self.heard.items()
            if campaigning and heir.may_inherit(node, (wall - at).total_seconds(), ttl)
        ]
        if not live:
            return
        at, node, instance, ttl = max(live)
        heard_ago = (wall - at).total_seconds()
        row.holder, row.instance, row.term = node, instance, row.term + 1
        row.acquired_at, row.expires_at = wall, self.clock.now() - heard_ago + ttl
        lease = Lease(election, node, "", row.term, wall, ttl, instance=instance,
                      version=str(row.version))  # fmt: skip
        self.last_grant = Grant(lease, at)

    def cached(self, election: str) -> Lease:
        """The lease as news from a cache: every member as last heard, no heartbeat."""
        members = tuple(
            Member(node, instance, "", "", ttl, at, (self.clock.wall() - at).total_seconds())
            for (node, instance), (at, _, ttl) in sorted(self.heard.items())
        )
        return dataclasses.replace(self.lease(election), members=members, cached=True)

    def touch(self) -> None:
        """A change every waiter hears of, with nothing changed (another key's event)."""
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


@dataclass(frozen=True)
class Call:
    method: str
    args: tuple[object, ...]
    at: float


@dataclass
class Script:
    """What the next calls do instead of answering normally."""

    failures: int = 0
    hang_until: float | None = None
    lose_to: Candidate | None = None
    # The next acquire is served, then its answer is lost (BackendUnavailable).
    lose_answer: bool = False
    # The next acquire writes its heartbeat (and keeps a spare alive), then fails.
    heard_then_lost: bool = False
    # The next acquire is answered from a cache (an etcd watch event): no request, the
    # members as last heard, ``cached`` and no heartbeat of its own.
    cached: bool = False
    # wait_for_change returns this grant once (a backend whose NOTIFY carried it).
    grant: Grant | None = None
    # The next acquire is served at once, but its answer arrives at this time.
    answer_at: float | None = None
    # The backend grants this many seconds instead of the ttl asked for.
    grant_seconds: float | None = None
    # The next acquisition is answered with this term (a backend that lost writes).
    answer_term: int | None = None
    # wait_for_change raises at once / returns at once, every time.
    broken_wait: bool = False
    spurious_wait: bool = False
    # wait_for_change raises this once: the next call, or the one under way when
    # LeaseStore.touch() wakes it (an etcd watch event showing our key deleted).
    lost: LeaseLost | None = None
    # The next release never answers, and lands at this time although its caller gave up
    # (a proxy holding it). It matches holder, instance and term only: the version the
    # caller names is not compared, so the engine's own rule alone must keep it harmless.
    release_lands_at: float | None = None
    # The next release raises this, untranslated: a backend bug.
    release_raises: Exception | None = None


@dataclass
class RecordingBackend(Backend):
    """One node's connection to a shared LeaseStore; records every call it gets."""

    store: LeaseStore
    calls: list[Call] = field(default_factory=list)
    script: Script = field(default_factory=Script)
    # The takeover argument of every acquire_or_renew, in order.
    takeovers: list[str] = field(default_factory=list)
    # The lost_term of every acquire_or_renew, and the reason of every release, in order.
    lost_terms: list[int] = field(default_factory=list)
    reasons: list[EndReason] = field(default_factory=list)
    # Whether releases may grant the lease to a standby (Capability.GRANTS).
    granting: bool = False
    # The version argument of every release, in order.
    release_versions: list[str] = field(default_factory=list)
    kind = "fake"
    _grants_told: set[int] = field(default_factory=set)
    _late: set[asyncio.Future[None]] = field(default_factory=set)  # releases still held

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]  # set per test
        return Capabilities() if self.granting else Capabilities({Capability.GRANTS: "a test"})

    @classmethod
    def from_url(cls, url: str) -> RecordingBackend:
        raise NotImplementedError

    @property
    def description(self) -> str:
        return "fake://"

    async def open(self, elections: Sequence[str]) -> None:
        self._record("open", tuple(elections))

    async def observe(
        self, election: str, candidate: Candidate | None = None, ttl: float = 0.0
    ) -> Lease:
        self._enter("observe", election)
        await self._hang(None)
        lease = self.store.lease(election)
        if candidate is None:
            return lease
        return heard_in(dataclasses.replace(lease, members=self.store.hear(candidate, False, ttl)),
                        candidate)  # fmt: skip

    async def acquire_or_renew(self, ask: Ask) -> Lease:
        election, candidate, ttl, timeout = ask.election, ask.candidate, ask.ttl, ask.timeout
        takeover, min_term = ask.takeover, ask.min_term
        self.lost_terms.append(ask.lost_term)
        self._enter("acquire_or_renew", election, candidate.node_id, ttl, timeout)
        self.takeovers.append(takeover)
        if self.script.cached:
            self.script.cached = False
            return self.store.cached(election)
        await self._hang(timeout)
        if self.script.heard_then_lost:
            self.script.heard_then_lost = False
            self.store.hear(candidate, True, ttl)
            raise BackendUnavailable("acquire_or_renew: timed out after the read (scripted)")
        if self.script.lose_to is not None:
            rival, self.script.lose_to = self.script.lose_to, None
            self.store.take(election, rival, ttl, self.store.lease(election).version)
        lease = self.store.take(
            election, candidate, self.script.grant_seconds or ttl, takeover, min_term
        )
        if self.script.answer_term is not None and lease.held_by(candidate):
            self.store.rows[election].term, self.script.answer_term = self.script.answer_term, None
            lease = self.store.lease(election)
        if self.script.lose_answer:
            self.script.lose_answer = False
            raise BackendUnavailable("acquire_or_renew: connection reset (scripted)")
        if self.script.answer_at is not None:
            until, self.script.answer_at = self.script.answer_at, None
            await self.store.clock.sleep_until(until)
        return heard_in(dataclasses.replace(lease, members=self.store.hear(candidate, True, ttl)),
                        candidate)  # fmt: skip

    async def release(self, release: Release) -> None:
        election, candidate, term = release.election, release.candidate, release.term
        reserve_for = release.reserve_for
        self.reasons.append(release.reason)
        self.release_versions.append(release.version)
        self._enter(
            "release", election, candidate.node_id, term, *[reserve_for][: bool(reserve_for)]
        )
        heir = release.heir if self.granting else None
        if (bug := self.script.release_raises) is not None:
            self.script.release_raises = None
            raise bug
        if self.script.release_lands_at is not None:
            at, self.script.release_lands_at = self.script.release_lands_at, None
            self._late.add(asyncio.ensure_future(self._land(at, election, candidate, term, heir)))
            await asyncio.Event().wait()  # no answer: the caller gives up
        await self._hang(None)
        self.store.release(election, candidate, term, reserve_for, release.ttl, heir)

    async def _land(
        self, at: float, election: str, candidate: Candidate, term: int, heir: Heir | None
    ) -> None:
        await self.store.clock.sleep_until(at)
        self.store.release(election, candidate, term, heir=heir)

    async def history(self, election: str, limit: int) -> list[Tenure]:
        self._record("history", (election, limit))
        return []

    async def wait_for_change(self, election: str, timeout: float) -> Grant | None:
        self._record("wait_for_change", (election, timeout))
        if self.script.broken_wait:
            raise BackendUnavailable("wait_for_change: connection lost (scripted)")
        if self.script.grant is not None:
            grant, self.script.grant = self.script.grant, None
            return grant
        if self.script.spurious_wait:
            return None
        changed = self.store.changed
        if self.script.lost is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout)
        if self.script.lost is not None:  # set before this wait, or during it (a touch)
            lost, self.script.lost = self.script.lost, None
            raise lost
        grant = self.store.last_grant
        if grant is None or id(grant) in self._grants_told:
            return None
        self._grants_told.add(id(grant))  # told once, like a NOTIFY
        return grant

    async def close(self) -> None:
        self._record("close", ())

    # ---- scripting ----

    def fail_next(self, count: int) -> None:
        """The next ``count`` requests raise BackendUnavailable."""
        self.script.failures = count

    def hang_next(self, until: float) -> None:
        """The next request waits until the clock reads ``until``, then is served; one
        with a timeout gives up (BackendUnavailable) if that comes first, as the contract says."""
        self.script.hang_until = until

    def lose_next_race(self, rival: Candidate) -> None:
        """The next acquire finds ``rival`` took the lease just before it."""
        self.script.lose_to = rival

    def methods(self, *names: str) -> list[Call]:
        return [c for c in self.calls if c.method in names]

    def _enter(self, method: str, *args: object) -> None:
        self._record(method, args)
        if self.script.failures > 0:
            self.script.failures -= 1
            raise BackendUnavailable(f"{method}: connection refused (scripted)")

    async def _hang(self, timeout: float | None) -> None:
        if self.script.hang_until is None:
            return
        until, self.script.hang_until = self.script.hang_until, None
        give_up = math.inf if timeout is None else self.store.clock.now() + timeout
        await self.store.clock.sleep_until(min(until, give_up))
        if give_up <= until:
            raise BackendUnavailable(f"request timed out after {timeout:g}s (scripted)")

    def _record(self, method: str, args: tuple[object, ...]) -> None:
        self.calls.append(Call(method, args, self.store.clock.now()))
