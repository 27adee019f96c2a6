"""A model of the lease-row backends (postgresql://, sqlite://): one row per election, a
compare-and-set judged on the server's clock, a version that every write changes, members'
heartbeats, grants and reservations, and NOTIFY wake-ups.

The server applies each request atomically, as the SQL of postgres/lease.py does. The backend
that talks to it is a ``Backend`` with the real LISTEN side (postgres/listen.py, Listener), so
a grant travels as the same JSON payload and is kept, told once, or dropped as in the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from leaderd.backends.asks import Ask, Heir, Release
from leaderd.backends.base import (
    Backend,
    BackendUnavailable,
    Candidate,
    Capabilities,
    Grant,
    Lease,
    heard_in,
)
from leaderd.backends.postgres.listen import Listener
from leaderd.backends.postgres.settings import PgSettings
from leaderd.backends.records import Member, Tenure

from .network import Link
from .vloop import EPOCH, NodeClock, VirtualLoop

_CHANNEL = "leaderd_model"
_SETTINGS = PgSettings.from_url("postgresql://model/leaderd", default_table="leaderd_lease")


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


@dataclass
class Heard:
    """A member's last heartbeat, on the server's clock."""

    candidate: Candidate
    at: float
    campaigning: bool
    ttl: float


@dataclass
class RowServer:
    """The database: one election's row and its members, on a clock at ``rate``."""

    loop: VirtualLoop
    rate: float = 1.0
    election: str = "model"
    row: Row = field(default_factory=Row)
    heard: dict[tuple[str, str], Heard] = field(default_factory=dict)
    listeners: list[tuple[Link, Listener]] = field(default_factory=list)
    tell: Callable[[str], None] = lambda _: None  # the run's story of server events

    def now(self) -> float:
        return self.rate * self.loop.time()

    def wall(self, at: float) -> dt.datetime:
        return EPOCH + dt.timedelta(seconds=at)

    def lease_until(self, candidate: Candidate, term: int) -> float:
        """Until when (virtual time) the row keeps this process as holder with ``term``, as
        it stands; -inf if it does not name it (the checker's truth)."""
        r = self.row
        mine = (r.holder, r.instance, r.term) == (candidate.node_id, candidate.instance, term)
        return r.expires_at / self.rate if mine else -math.inf

    # ---- the requests, each applied atomically ----

    def acquire(self, me: Candidate, ttl: float, takeover: str, min_term: int) -> Lease:
        r, now = self.row, self.now()
        mine = (r.holder, r.instance) == (me.node_id, me.instance)
        live = r.holder is not None and r.expires_at > now
        free = r.holder is None and not self._reserved_against(me.node_id)
        if free or mine or (r.holder is not None and not live and takeover == self._version()):
            if not (mine and live):  # an acquisition: a new term
                r.term, r.acquired_at = max(r.term + 1, min_term), self.wall(now)
                self.tell(f"server: {me.instance} acquires term {r.term}")
                self.notify(f"{r.term} acquired {self.election}")
            r.holder, r.instance, r.address = me.node_id, me.instance, me.address
            r.expires_at, r.version = now + ttl, r.version + 1
            r.reserved_for, r.reserved_until = "", 0.0
        return heard_in(self.lease(self.hear(me, True, ttl)), me)

    def observe(self, me: Candidate | None, ttl: float) -> Lease:
        return heard_in(
            self.lease(self.hear(me, False, ttl) if me is not None else self.members()), me
        )

    def release(
        self,
        me: Candidate,
        term: int,
        reserve_for: str,
        ttl: float,
        heir: Heir | None,
        version: str,
    ) -> None:
        """As postgres/lease.py's: only this holder's term, and with ``version`` only while the row
        still has it (a release that arrives after a renewal of the same term changes nothing)."""
        r, now = self.row, self.now()
        if (r.holder, r.instance, r.term) != (me.node_id, me.instance, term):
            return
        if version and version != self._version():
            self.tell(f"server: {me.instance}'s release of term {term} at {version} is stale")
            return
        heard = self._heir(heir) if heir is not None and not reserve_for else None
        to = f", reserved for {reserve_for}" if reserve_for else ""
        self.tell(f"server: {me.instance} releases term {term}{to}")
        r.version += 1
        r.reserved_for, r.reserved_until = reserve_for, now + ttl if reserve_for else 0.0
        if heard is None:
            r.holder, r.instance, r.address, r.expires_at = None, "", "", now
            self.notify(f"{term} released {self.election}")
            return
        c = heard.candidate
        self.tell(f"server: granted to {c.instance}, term {term + 1}, heard at {heard.at:.4f}")
        r.holder, r.instance, r.address, r.term = c.node_id, c.instance, c.address, term + 1
        r.acquired_at, r.expires_at = self.wall(now), heard.at + heard.ttl
        granted = {"election": self.election, "holder": c.node_id, "instance": c.instance,
                   "address": c.address, "version": self._version(), "ttl": heard.ttl,
                   "heard_at": self.wall(heard.at).isoformat(),
                   "acquired_at": r.acquired_at.isoformat()}  # fmt: skip
        self.notify(f"{r.term} granted {orjson.dumps(granted).decode()}")
        self.notify(f"{r.term} acquired {self.election}")

    # ---- parts ----

    def hear(self, me: Candidate, campaigning: bool, ttl: float) -> tuple[Member, ...]:
        self.heard[me.node_id, me.instance] = Heard(me, self.now(), campaigning, ttl)
        return self.members()

    def members(self) -> tuple[Member, ...]:
        now = self.now()
        return tuple(Member(h.candidate.node_id, h.candidate.instance, h.candidate.address, "",
                            h.ttl, self.wall(h.at), now - h.at)
                     for h in self.heard.values())  # fmt: skip

    def lease(self, members: tuple[Member, ...]) -> Lease:
        r, now = self.row, self.now()
        if r.holder is None:
            left = r.reserved_until - now
            to = r.reserved_for if left > 0 else ""
            return Lease(self.election, None, "", r.term, None, None, reserved_for=to,
                         reserved_in=left if to else 0.0, members=members)  # fmt: skip
        return Lease(self.election, r.holder, r.address, r.term, r.acquired_at,
                     max(0.0, r.expires_at - now), instance=r.instance, version=self._version(),
                     members=members)  # fmt: skip

    def notify(self, payload: str) -> None:
        for link, listener in self.listeners:
            link.wake(lambda listener=listener: listener._on_notify(None, 0, _CHANNEL, payload))

    def _version(self) -> str:
        return f"{self.row.version}.{round(self.row.expires_at * 1e6)}"

    def _reserved_against(self, node_id: str) -> bool:
        r = self.row
        return r.reserved_until > self.now() and r.reserved_for not in ("", node_id)

    def _heir(self, heir: Heir) -> Heard | None:
        now = self.now()
        live = [h for h in self.heard.values() if h.campaigning
                and heir.may_inherit(h.candidate.node_id, now - h.at, h.ttl)]  # fmt: skip
        return max(live, key=lambda h: h.at, default=None)


class RowBackend(Backend):
    """One daemon's backend over a RowServer: requests travel its Link, with its faults."""

    kind = "model-row"
    capabilities = Capabilities()

    def __init__(self, server: RowServer, link: Link) -> None:
        self.server = server
        self.link = link
        self.listener = Listener(_SETTINGS, _CHANNEL)
        server.listeners.append((link, self.listener))
        self._last: Lease | None = None  # the last answer that reached this process

    @classmethod
    def from_url(cls, url: str) -> RowBackend:
        raise NotImplementedError

    @property
    def description(self) -> str:
        return "model-row://"

    async def open(self, elections: Sequence[str]) -> None:
        return None

    async def observe(
        self, election: str, candidate: Candidate | None = None, ttl: float = 0.0
    ) -> Lease:
        return await self._ask("observe", lambda: self.server.observe(candidate, ttl), 5.0)

    async def acquire_or_renew(self, ask: Ask) -> Lease:
        cached = self._cached(ask.candidate)
        if cached is not None:
            return cached
        acquire = self.server.acquire
        return await self._ask("acquire", lambda: acquire(ask.candidate, ask.ttl, ask.takeover,
                                                          ask.min_term), ask.timeout)  # fmt: skip

    async def release(self, release: Release) -> None:
        r, apply = release, self.server.release
        await self.link.request("release", lambda: apply(r.candidate, r.term, r.reserve_for, r.ttl,
                                                         r.heir, r.version), 5.0)  # fmt: skip

    async def wait_for_change(self, election: str, timeout: float) -> Grant | None:
        return await self.listener.wait(election, timeout)

    async def history(self, election: str, limit: int) -> list[Tenure]:
        return []

    async def close(self) -> None:
        if (self.link, self.listener) in self.server.listeners:  # close is idempotent
            self.server.listeners.remove((self.link, self.listener))

    async def _ask(self, kind: str, apply: Callable[[], Lease], timeout: float) -> Lease:
        lease = await self.link.request(kind, apply, timeout)
        self._last = lease
        self.listener.saw(lease.election, lease.term, held=lease.holder is not None)
        if self.link.chance("late_failure", self.link.faults.late_failure):
            await asyncio.sleep(timeout)  # a second request of the round stalls
            raise BackendUnavailable(f"{kind}: stalled after its answer (model)")
        return lease

    def _cached(self, me: Candidate) -> Lease | None:
        """A fault: the last answer again, with no request (only one naming another holder,
        as a cache of someone else's lease would)."""
        lease = self._last
        if lease is None or lease.holder is None:
            return None
        if (lease.holder, lease.instance) == (me.node_id, me.instance):
            return None
        if not self.link.chance("cached_answer", self.link.faults.cache):
            return None
        return dataclasses.replace(lease, heartbeat=None, cached=True)


class RowWorld:
    """postgresql:// and sqlite:// semantics: one lease row on the server's clock."""

    def __init__(self, loop: VirtualLoop, rng: random.Random, tell: Callable[[str], None]) -> None:
        drift = 0.01 * 0.475
        self.server = RowServer(loop, rate=rng.uniform(1 - drift, 1 + drift), tell=tell)

    def backend(self, name: str, link: Link, clock: NodeClock) -> Backend:
        return RowBackend(self.server, link)

    def lease_until(self, candidate: Candidate, term: int) -> float:
        return self.server.lease_until(candidate, term)

    def installed(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()
