"""Backend requests as the tests write them: the engine's values (Ask, Release) built from
keyword arguments, so that a test names only what it is about."""

from __future__ import annotations

from collections.abc import Awaitable

from leaderd.backends.asks import Ask, Release
from leaderd.backends.base import Backend, Candidate, Lease
from leaderd.backends.records import EndReason
from leaderd.election.heir import heir_of


def ask(
    backend: Backend,
    election: str,
    candidate: Candidate,
    ttl: float,
    timeout: float = 5.0,
    wait: float = 0.0,
    *,
    takeover: str = "",
    min_term: int = 0,
    lost_term: int = 0,
) -> Awaitable[Lease]:
    """``backend.acquire_or_renew`` of this Ask."""
    return backend.acquire_or_renew(
        Ask(election, candidate, ttl, timeout, wait, takeover, min_term, lost_term)
    )


def release(
    backend: Backend,
    election: str,
    candidate: Candidate,
    term: int,
    reason: EndReason | str = EndReason.RELEASED,
    *,
    reserve_for: str = "",
    ttl: float = 0.0,
    grant: bool = False,
    version: str = "",
) -> Awaitable[None]:
    """``backend.release`` of this Release; ``grant``: to the heir the engine would name."""
    heir = heir_of(candidate) if grant else None
    return backend.release(
        Release(election, candidate, term, reason, version, reserve_for, ttl, heir)
    )
