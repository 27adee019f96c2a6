"""The backend interface: the storage of one lease per election, and nothing else.

A backend knows no policy: no timing rules, no self-fencing, no state machine. It
answers five questions atomically (observe, acquire-or-renew, release, wait for a
change, close) and the election engine decides everything from the answers.

Contract shared by every backend (the contract test suite checks it):

* At most one holder per election at any instant, as judged by the backend's own
  clock (the PostgreSQL server's ``now()``, the host's clock for SQLite).
* ``term`` strictly increases on every acquisition (a new holder, or the same
  holder again after its lease expired or was released); a renewal keeps it.
  Terms are stored, so they survive release and restarts, and never decrease.
* Release expires the row in place: the holder is cleared, the term is kept.
* Driver exceptions never escape: they are translated into ``BackendError``.
"""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar


class BackendError(Exception):
    """A backend request failed. The engine logs it and retries later.

    The message must be safe to log and to serve: never a password or a full DSN.
    """


class BackendUnavailable(BackendError):
    """Transient: the database cannot be reached, timed out, or is busy."""


class BackendFatal(BackendError):
    """Retrying cannot help: bad URL, corrupt file, permission denied, wrong schema."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """The node asking for a lease, as other nodes will see it."""

    node_id: str
    address: str = ""


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
    # Seconds until the lease expires, judged by the backend's clock; None when free
    # or when the backend has no expiry (advisory lock held by a live session, static).
    expires_in: float | None

    def held_by(self, node_id: str) -> bool:
        return self.holder is not None and self.holder == node_id


class Backend(abc.ABC):
    """Stores one lease per election. One instance serves every election of a daemon.

    Methods may be called concurrently for different elections, never concurrently
    for the same election (the engine runs one loop per election).
    """

    # URL scheme family, reported by /status and metrics: "sqlite", "postgresql", ...
    kind: ClassVar[str]

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: str) -> Backend:
        """Build from the daemon's backend URL; raise BackendFatal (redacted) if invalid."""

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """The backend's URL with any password removed, safe to log and serve."""

    @abc.abstractmethod
    async def open(self, elections: Sequence[str]) -> None:
        """Prepare storage (create the file, tables, connections) for these elections.

        Raise BackendFatal when it can never work (the daemon exits 1), and
        BackendUnavailable when the server cannot be reached now (the daemon starts
        anyway and every later request retries the connection).
        """

    @abc.abstractmethod
    async def observe(self, election: str) -> Lease:
        """Read the lease without changing it. Must be cheap: followers call it."""

    @abc.abstractmethod
    async def acquire_or_renew(
        self, election: str, candidate: Candidate, ttl: float, timeout: float, wait: float = 0.0
    ) -> Lease:
        """Atomically take or extend the lease for ``candidate``, and return it.

        If the lease is free, expired, or already held by ``candidate``, the candidate
        holds it for ``ttl`` seconds from the backend's now (a renewal keeps the term,
        an acquisition takes ``term + 1``). Otherwise nothing changes and the current
        holder is returned. The caller holds the lease iff ``result.held_by(node_id)``.

        Must give up after ``timeout`` seconds (raise BackendUnavailable): the engine
        sends it with what is left before its deadline. A backend that can wait for a
        held lease inside the request (a blocking advisory lock) may block up to
        ``wait`` seconds for it to be freed; lease backends ignore ``wait``.
        """

    @abc.abstractmethod
    async def release(self, election: str, candidate: Candidate, term: int) -> None:
        """Expire the lease in place if ``candidate`` holds it with ``term``; else no-op.

        The term is kept. Wake the other nodes' ``wait_for_change`` (NOTIFY, ...),
        so a standby takes over at once instead of after its polling period.
        """

    @abc.abstractmethod
    async def wait_for_change(self, election: str, timeout: float) -> None:
        """Return when the lease may have changed (released or taken), or after ``timeout``.

        Spurious early returns are allowed; missing a change only costs latency,
        never safety. Must not raise on timeout.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Close connections and files. Idempotent. Does not release leases."""
