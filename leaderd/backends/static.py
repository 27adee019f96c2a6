"""static:// — this node always leads. Single-node and development mode.

The term still strictly increases across restarts (docs/algorithm.md, "Fencing token"): with a path
(``static:///var/lib/leaderd/static-terms.json``, what a bare ``static://`` in the daemon's
configuration becomes) the last term of each election is kept in that file, written
atomically and fsynced before the lease is granted. Without a path (tests), terms live in
memory only.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import urllib.parse
from collections.abc import Sequence

from .base import Backend, BackendFatal, BackendUnavailable, Candidate, Lease


class StaticBackend(Backend):
    """Grants every election to the first candidate that asks; the term moves when the
    holder releases and a node acquires again. One daemon per term file."""

    kind = "static"

    def __init__(self, term_file: str | None = None) -> None:
        self.term_file = term_file
        self._leases: dict[str, Lease] = {}
        self._changed: dict[str, asyncio.Event] = {}

    @classmethod
    def from_url(cls, url: str) -> StaticBackend:
        usage = "expected static:// or static:///abs/path/of/the/term/file"
        try:
            parts = urllib.parse.urlsplit(url)
        except ValueError:
            raise BackendFatal(f"bad static URL {url!r}: {usage}") from None
        if parts.scheme.lower() != "static" or parts.netloc or parts.query or parts.fragment:
            raise BackendFatal(f"static backend takes no host or options: {url!r}: {usage}")
        path = urllib.parse.unquote(parts.path)
        if path in ("", "/"):
            return cls()
        if not os.path.isabs(path):
            raise BackendFatal(f"static term file must be an absolute path: {url!r}")
        return cls(path)

    @property
    def description(self) -> str:
        return f"static://{self.term_file or ''}"

    @property
    def hands_over(self) -> bool:
        return False  # this node always leads: no standby can take a reserved lease

    async def open(self, elections: Sequence[str]) -> None:
        terms = self._load_terms()
        for election in elections:
            self._leases.setdefault(election, _free(election, terms.get(election, 0)))

    async def observe(self, election: str) -> Lease:
        return self._leases.setdefault(election, _free(election, term=0))

    async def acquire_or_renew(
        self,
        election: str,
        candidate: Candidate,
        ttl: float,
        timeout: float,
        wait: float = 0.0,
        *,
        takeover: str = "",
        min_term: int = 0,
    ) -> Lease:
        lease = await self.observe(election)
        if lease.holder is None:
            term = max(lease.term + 1, min_term)
            self._save_term(election, term)  # durable before it is granted
            lease = Lease(
                election=election,
                holder=candidate.node_id,
                address=candidate.address,
                term=term,
                acquired_at=dt.datetime.now(dt.UTC),
                expires_in=None,
                instance=candidate.instance,
                version=str(term),
            )
            self._leases[election] = lease
            self._wake(election)
        return lease

    async def release(
        self,
        election: str,
        candidate: Candidate,
        term: int,
        *,
        reserve_for: str = "",
        ttl: float = 0.0,
    ) -> None:
        lease = await self.observe(election)
        if lease.held_by(candidate) and lease.term == term:
            # No reservation: no other node can ever ask (the API refuses resign?to=).
            self._leases[election] = _free(election, term=term)
            self._wake(election)

    async def wait_for_change(self, election: str, timeout: float) -> None:
        event = self._changed.setdefault(election, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    async def close(self) -> None:
        self._wake_all()

    def _load_terms(self) -> dict[str, int]:
        if self.term_file is None:
            return {}
        try:
            with open(self.term_file, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise BackendFatal(f"cannot read the static term file {self.term_file}: {exc}") from exc
        if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
            raise BackendFatal(f"static term file {self.term_file} is not a map of terms")
        return data

    def _save_term(self, election: str, term: int) -> None:
        if self.term_file is None:
            return
        terms = {name: lease.term for name, lease in self._leases.items()}
        terms[election] = term
        temporary = f"{self.term_file}.tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as f:
                json.dump(terms, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self.term_file)
            directory = os.open(os.path.dirname(self.term_file) or ".", os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot save the term to {self.term_file}: {exc.strerror}"
            ) from exc

    def _wake(self, election: str) -> None:
        event = self._changed.pop(election, None)
        if event is not None:
            event.set()

    def _wake_all(self) -> None:
        for election in list(self._changed):
            self._wake(election)


def _free(election: str, term: int) -> Lease:
    return Lease(election, holder=None, address="", term=term, acquired_at=None, expires_in=None)
