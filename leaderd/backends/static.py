"""static:// — this node always leads. Single-node and development mode."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import Sequence

from .base import Backend, BackendFatal, Candidate, Lease


class StaticBackend(Backend):
    """Grants every election to the first candidate that asks; the term only moves
    when the holder releases and a node acquires again (kept in memory: a static
    daemon is alone, so there is nobody to fence against across restarts)."""

    kind = "static"

    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}
        self._changed: dict[str, asyncio.Event] = {}

    @classmethod
    def from_url(cls, url: str) -> StaticBackend:
        if url.rstrip("/") not in ("static:", "static:/", "static://"):
            raise BackendFatal(f"static backend takes no host, path or options: {url!r}")
        return cls()

    @property
    def description(self) -> str:
        return "static://"

    async def open(self, elections: Sequence[str]) -> None:
        for election in elections:
            self._leases.setdefault(election, _free(election, term=0))

    async def observe(self, election: str) -> Lease:
        return self._leases.setdefault(election, _free(election, term=0))

    async def acquire_or_renew(
        self, election: str, candidate: Candidate, ttl: float, timeout: float, wait: float = 0.0
    ) -> Lease:
        lease = await self.observe(election)
        if lease.holder is None:
            lease = Lease(
                election=election,
                holder=candidate.node_id,
                address=candidate.address,
                term=lease.term + 1,
                acquired_at=dt.datetime.now(dt.UTC),
                expires_in=None,
            )
            self._leases[election] = lease
            self._wake(election)
        return lease

    async def release(self, election: str, candidate: Candidate, term: int) -> None:
        lease = await self.observe(election)
        if lease.held_by(candidate.node_id) and lease.term == term:
            self._leases[election] = _free(election, term=term)
            self._wake(election)

    async def wait_for_change(self, election: str, timeout: float) -> None:
        event = self._changed.setdefault(election, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    async def close(self) -> None:
        self._wake_all()

    def _wake(self, election: str) -> None:
        event = self._changed.pop(election, None)
        if event is not None:
            event.set()

    def _wake_all(self) -> None:
        for election in list(self._changed):
            self._wake(election)


def _free(election: str, term: int) -> Lease:
    return Lease(election, holder=None, address="", term=term, acquired_at=None, expires_in=None)
