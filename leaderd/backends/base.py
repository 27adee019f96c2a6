"""The backend interface: the storage of one lease per election, and nothing else.

A backend knows no policy: no timing rules, no self-fencing, no state machine. It
answers five questions atomically (observe, acquire-or-renew, release, wait for a
change, close) and the election engine decides everything from the answers.

Contract shared by every backend (the contract test suite checks it):

* At most one holder per election at any instant, as judged by the backend's own
  clock (the PostgreSQL server's ``now()``, the host's clock for SQLite).
* A holder is a node id *and* an instance token (one per process): a lease held by
  the same node id under another instance belongs to someone else (docs/algorithm.md,
  "Holders, instances and taking over").
* A lease that was not released is taken over only when the backend judges it expired
  *and* the engine names the exact ``version`` it has watched stay unchanged for one
  ttl on its own clock (``takeover``): a step of the backend's clock alone cannot cut
  a live holder's lease short (docs/algorithm.md, same section). One exception, sqlite://
  only: a backend that has the kernel's proof that the holder's process is dead (its holder
  lock freed, sqlite/proof.py) takes its lease over in the claim itself, even with
  ``takeover=""``; a holder that recorded no proof is waited out by the rule above
  (docs/algorithm.md, "Crash failover on one host").
* ``term`` strictly increases on every acquisition (a new holder, or the same
  holder again after its lease expired or was released), and is at least the
  ``min_term`` the engine asks for (its high-water mark + 1); a renewal keeps it.
  Terms are stored durably, so they survive release and restarts, and never decrease.
* Release expires the row in place: the holder is cleared, the term is kept. A release
  may reserve the free lease for one named node id for one ttl on the backend's clock (a
  hand-over to a chosen standby): until then only that node id may acquire it, and every
  acquisition clears the reservation (docs/algorithm.md, "Hand-over to a chosen standby").
* A backend that ``grants`` may instead hand a released lease straight to its freshest live
  campaigning member, with the next term, in the release's own write, and tell that member
  with a ``Grant`` from ``wait_for_change``: the new leader needs no write of its own
  (docs/algorithm.md, "One-write hand-over").
* Driver exceptions never escape: they are translated into ``BackendError``.
* Every acquire-or-renew, and every observe that names a candidate, registers that candidate
  as a member (records.Member) in the same request, and the answer lists the election's
  members and names that heartbeat (``Lease.heartbeat``); members silent for PRUNE_AFTER_TTLS
  of their ttl are deleted. A stopping daemon's last observe names its candidate with
  records.LEFT_TTL (0): it is stale at once, and the next request prunes it.
* Only a request's own answer makes a leader: an answer served from what the backend already
  knew (a watch event) says so (``Lease.cached``) and names no heartbeat; a heartbeat written
  by an earlier request that failed is never named (docs/algorithm.md, "Only a request's own
  answer makes a leader").
* Every change of holder is recorded (records.Tenure) in the transaction that makes it where
  the backend allows it, with how the previous term ended; HISTORY_RETENTION records are kept.
"""

from __future__ import annotations

import abc
import datetime as dt
import enum
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from .. import __version__
from .records import Member, Tenure

if TYPE_CHECKING:  # asks.py builds on Candidate, defined here
    from .asks import Ask, Release


class Capability(enum.Enum):
    """What a backend can do beyond the contract every backend keeps."""

    EXPIRES = "expires"  # a holder's lease lapses without a release
    TTL_LEFT = "ttl left"  # expires_in reports the seconds left of the ttl, on its own clock
    DURABLE = "durable"  # terms survive closing every instance and opening a new one
    # An expired, unreleased lease still names its holder and is taken only by naming its
    # version (the one-ttl takeover, docs/algorithm.md); a session's end is no such lease.
    TAKEOVER = "takeover"
    RESERVES = "reserves"  # a release may reserve the free lease for one node id, one ttl
    GRANTS = "grants"  # release(grant=True) hands the lease to a standby in the same write
    # A release names the version it was last answered and changes nothing once a renewal
    # moved it (docs/algorithm.md, "A release in doubt").
    VERSIONED_RELEASE = "versioned release"


class Capabilities(frozenset[Capability]):
    """Every capability but those a backend lacks, each lacking one named with the reason."""

    lacks: Mapping[Capability, str]

    def __new__(cls, lacks: Mapping[Capability, str] | None = None) -> Capabilities:
        reasons = dict(lacks or {})
        capabilities = super().__new__(cls, set(Capability) - reasons.keys())
        capabilities.lacks = MappingProxyType(reasons)
        return capabilities


class BackendError(Exception):
    """A backend request failed. The engine logs it and retries later.

    The message must be safe to log and to serve: never a password or a full DSN.
    """


class BackendUnavailable(BackendError):
    """Transient: the database cannot be reached, timed out, or is busy."""


class BackendFatal(BackendError):
    """Retrying cannot help: bad URL, corrupt file, permission denied, wrong schema."""


class LeaseLost(BackendFatal):
    """Whatever this node held is gone for good (its lease file was deleted or replaced, or
    etcd deleted its key): the engine steps down at once instead of waiting for its deadline."""


def new_instance() -> str:
    """A token that names one daemon process: 16 hex digits, never reused."""
    return secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class Candidate:
    """The node asking for a lease, as other nodes will see it."""

    node_id: str
    address: str = ""
    # One per process: a restarted daemon, or a second daemon with the same node id, is
    # another holder (docs/algorithm.md, "Holders, instances and taking over").
    instance: str = field(default_factory=new_instance)
    # The daemon's leaderd version, listed with the members.
    leaderd_version: str = __version__
    # Who may lead (docs/algorithm.md, "Who leads"), written with each heartbeat: a grant
    # prefers the highest priority (0: a witness, never granted); ``health`` is "" while
    # this node's health checks pass, else why not (such a node does not campaign).
    priority: int = 1
    health: str = ""
    # A switchover this node asks the leader for ("" for none), as election/switchover.py
    # writes it: carried by its heartbeats, so it outlives any one leader.
    switchover: str = ""


@dataclass(frozen=True, slots=True)
class Lease:
    """One election's lease as the backend saw it during one request."""

    election: str
    # Node id of the live holder; None when free (never held, released, expired).
    holder: str | None
    # The holder's advertised address; "" when free or not advertised.
    address: str
    # The last term granted (kept across release); 0 if the election was never held.
    term: int
    # When the current holder's term began, on the backend's clock; None when free.
    acquired_at: dt.datetime | None
    # Seconds until the lease expires, judged by the backend's clock: 0 once it has
    # expired (the holder is still named: it never released); None when free or when the
    # backend has no expiry (advisory lock held by a live session, static).
    expires_in: float | None
    # The holder's instance token; "" when free or unknown.
    instance: str = ""
    # Changes with every write by the holder (renewals too): the engine's proof that the
    # holder is still alive. Opaque; "" when free.
    version: str = ""
    # A free lease reserved for this node id by its last holder's release; "" when none or
    # once the reservation has lapsed on the backend's clock.
    reserved_for: str = ""
    # Seconds the reservation lasts, judged by the backend's clock; 0 without one.
    reserved_in: float = 0.0
    # The election's members as this request saw them (the asking candidate included);
    # not part of the lease's identity.
    members: tuple[Member, ...] = field(default=(), compare=False)
    # The heartbeat this very request wrote of the asking candidate (its records.Member.heard_at,
    # what a Grant names); None when it wrote none. Never a heartbeat an earlier request wrote.
    heartbeat: dt.datetime | None = field(default=None, compare=False)
    # True when the backend answered from what it already knew (a watch event), without a
    # request of its own: news, which may name a holder or end a hold early, but never makes
    # this process leader, moves a deadline or tells what an unanswered request did
    # (docs/algorithm.md, "Only a request's own answer makes a leader").
    cached: bool = field(default=False, compare=False)

    def held_by(self, candidate: Candidate) -> bool:
        """The lease is this very process's (node id and instance) and not expired."""
        return (
            self.holder == candidate.node_id
            and self.instance == candidate.instance
            and not self.expired
        )

    def held_by_twin(self, candidate: Candidate) -> bool:
        """A live lease under this node id but another instance: a duplicate node id."""
        return (
            self.holder == candidate.node_id
            and self.instance != candidate.instance
            and not self.expired
        )

    def reserved_against(self, candidate: Candidate) -> bool:
        """Free, but reserved for another node id: this candidate may not acquire it yet."""
        return self.holder is None and self.reserved_for not in ("", candidate.node_id)

    @property
    def expired(self) -> bool:
        """The backend judged the holder's lease over (it never released it)."""
        return self.holder is not None and self.expires_in is not None and self.expires_in <= 0


def heard_in(lease: Lease, candidate: Candidate | None) -> Lease:
    """``lease`` naming, as its ``heartbeat``, the heard_at its members list gives
    ``candidate`` (None: a read that wrote no heartbeat): for a backend whose request writes
    the heartbeat and lists the members in one transaction, so the listed one is its own."""
    if candidate is None:
        return lease
    me = (candidate.node_id, candidate.instance)
    stamps = [m.heard_at for m in lease.members if (m.node_id, m.instance) == me]
    return replace(lease, heartbeat=stamps[0] if stamps else None)


@dataclass(frozen=True, slots=True)
class Grant:
    """A release handed the lease to this process (docs/algorithm.md, "One-write hand-over").

    The granted lease lasts at least ``lease.expires_in`` (capped at the ttl) after the
    backend received a request of this process: the one whose answer listed this member as
    heard at ``heard_at`` (records.Member.heard_at), exactly. On postgresql:// the release
    set the expiry to that heartbeat plus the ttl; on etcd, the key is under this process's
    spare lease, which that request kept alive. The engine leads on the grant only if one of
    its own requests was answered with that very ``Lease.heartbeat``, and self-fences from the
    moment it sent that request.
    """

    lease: Lease
    heard_at: dt.datetime


class Backend(abc.ABC):
    """Stores one lease per election. One instance serves every election of a daemon.

    Methods may be called concurrently for different elections, never concurrently
    for the same election (the engine runs one loop per election).
    """

    # URL scheme family, reported by /status and metrics: "sqlite", "postgresql", ...
    kind: str

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: str) -> Backend:
        """Build from the daemon's backend URL; raise BackendFatal (redacted) if invalid."""

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """The backend's URL with any password removed, safe to log and serve."""

    # What this backend can do, each capability it lacks declared with the reason. An
    # instance may narrow it by its URL's settings (a static term file, a takeover mode).
    capabilities: Capabilities

    def ttl_rule_only(self) -> None:
        """This daemon supervises a command that may outlive it: its leases are taken over
        by the one-ttl rule only, never on a proof of its process's death. A no-op for
        backends that prove no deaths."""
        return None

    @abc.abstractmethod
    async def open(self, elections: Sequence[str]) -> None:
        """Prepare storage (create the file, tables, connections) for these elections.

        Raise BackendFatal when it can never work (the daemon exits 1), and
        BackendUnavailable when the server cannot be reached now (the daemon starts
        anyway and every later request retries the connection).
        """

    @abc.abstractmethod
    async def observe(
        self, election: str, candidate: Candidate | None = None, ttl: float = 0.0
    ) -> Lease:
        """Read the lease without changing it. Must be cheap: followers call it.

        With a ``candidate`` (and its ``ttl``), register it as a member in the same request
        (a cooling-down node stays listed) and name that heartbeat (``Lease.heartbeat``); the
        answer lists the members either way.
        """

    @abc.abstractmethod
    async def acquire_or_renew(self, ask: Ask) -> Lease:
        """Atomically take or extend the lease for ``ask.candidate``, and return it.

        The candidate holds the lease for ``ask.ttl`` seconds from the backend's now when:

        1. it already holds it (same node id and instance): a renewal, the term is kept
           (if the backend had expired it meanwhile, it is an acquisition);
        2. the lease is free (never held, or released) and not reserved for another node
           id (``Lease.reserved_against``): an acquisition, which ends any reservation;
        3. another holder's lease is expired by the backend's clock *and* its current
           ``version`` equals ``takeover`` (what the engine watched for one ttl): an
           acquisition. With ``takeover=""`` an unreleased lease is never taken;
        4. (sqlite:// only) another holder's lease, live or not, whose row carries a proof
           that the backend shows dead in this very request: the kernel freed that holder's
           lock on the inode the row names. An acquisition, whatever ``takeover`` says.

        An acquisition takes ``max(term + 1, min_term)`` and must be durable before the
        answer is sent. Otherwise nothing changes and the current holder is returned.
        The caller holds the lease iff ``result.held_by(candidate)``.

        The same request registers the candidate as a member, lists the members and names
        that heartbeat (``Lease.heartbeat``). An answer not produced by a request of this
        call (a watch event already told it) is ``cached`` and names no heartbeat.

        An acquisition records a history record for the new term and ends the previous one
        (records.end_of_acquisition). ``lost_term``: a term this candidate stepped down from
        unable to reach the backend; its record, once ended, says "lost the backend".

        Must give up after ``timeout`` seconds (raise BackendUnavailable): the engine
        sends it with what is left before its deadline. A backend that can wait for a
        held lease inside the request (a blocking advisory lock) may block up to
        ``wait`` seconds for it to be freed; lease backends ignore ``wait``.
        """

    @abc.abstractmethod
    async def release(self, release: Release) -> None:
        """Expire the lease in place if ``candidate`` (node id and instance) holds it with
        ``term``, even if the backend already judged it expired; else no-op. The term's
        history record ends with ``reason`` in the same transaction.

        With ``version`` (the lease's version as last answered to this process), only if the
        lease still has that version: a release that arrives late, after a renewal of the
        same term, then changes nothing (docs/algorithm.md, "A release in doubt"). Grants and
        reservations are part of the release's write, so they are conditioned alike.

        With ``reserve_for``, the free lease is reserved for that node id for ``ttl``
        seconds of the backend's clock, in the same atomic write. The term is kept. Wake
        the other nodes' ``wait_for_change`` (NOTIFY, ...), so a standby takes over at once
        instead of after its polling period (and, at the reservation's end, every one).

        With a ``heir`` (and no ``reserve_for``), a backend that GRANTS hands the lease in the
        same write to the freshest member the Heir allows (asks.Heir): term + 1, expiring no
        sooner than the Grant says, history recorded; and tells it with a Grant
        (``wait_for_change``). With no such member it is released.
        """

    @abc.abstractmethod
    async def wait_for_change(self, election: str, timeout: float) -> Grant | None:
        """Return when the lease may have changed (released or taken), or after ``timeout``;
        with a Grant when the change is a release that handed the lease to this process.

        Spurious early returns are allowed; missing a change (or a grant) only costs
        latency, never safety. Must not raise on timeout. Raises LeaseLost when the change
        proves that the lease the last answer gave this process is gone (etcd: its key was
        deleted or put by another): the engine then steps down without waiting for a round.
        """

    @abc.abstractmethod
    async def history(self, election: str, limit: int) -> list[Tenure]:
        """The newest ``limit`` history records of ``election``, newest first."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close connections and files. Idempotent. Does not release leases."""
