"""static:// — this node always leads. Single-node and development mode.

The term still strictly increases across restarts (docs/algorithm.md, "Fencing token"): with a path
(``static:///var/lib/leaderd/static-terms.json``, what a bare ``static://`` in the daemon's
configuration becomes) the last term of each election is kept in that file, written
atomically and fsynced before the lease is granted. Without a path (tests), terms live in
memory only. Members are the candidates that asked (in memory: one daemon); the history
is kept beside the term file, in ``<term file>.history.json`` (docs/api.md, "History").
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import urllib.parse
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

from ..clock import boottime
from .asks import Ask, Release
from .base import (
    Backend,
    BackendFatal,
    BackendUnavailable,
    Candidate,
    Capabilities,
    Capability,
    Lease,
    heard_in,
)
from .records import HISTORY_RETENTION, EndReason, Member, Tenure


class StaticBackend(Backend):
    """Grants every election to the first candidate that asks; the term moves when the
    holder releases and a node acquires again. One daemon per term file."""

    kind = "static"
    # With a term file: terms survive a restart.
    _DURABLE = Capabilities(
        {
            Capability.EXPIRES: "static leases never expire",
            Capability.TTL_LEFT: "static leases have no ttl",
            Capability.TAKEOVER: "static leases never expire",
            Capability.RESERVES: "static:// has one node: no standby to hand over to",
            Capability.GRANTS: "static:// has one node: no standby to hand over to",
            Capability.VERSIONED_RELEASE: "static:// has one process, whose release and "
            "renewal never cross",
        }
    )
    capabilities = Capabilities(
        {
            **_DURABLE.lacks,
            Capability.DURABLE: "static:// without a term file keeps terms in memory",
        }
    )

    def __init__(self, term_file: str | None = None) -> None:
        self.term_file = term_file
        if term_file is not None:  # its terms survive in the file
            self.capabilities = self._DURABLE
        self._leases: dict[str, Lease] = {}
        self._changed: dict[str, asyncio.Event] = {}
        # (election, node id, instance) -> (candidate, its ttl, when heard: boottime, wall).
        # (election, node id, instance) -> (candidate, ttl, heard, wall, campaigning)
        self._members: dict[tuple[str, str, str], tuple[Candidate, float, float, dt.datetime, bool]]
        self._members = {}
        self._history: dict[str, list[Tenure]] = {}

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

    async def open(self, elections: Sequence[str]) -> None:
        terms = self._load_terms()
        self._history = self._load_history()
        for election in elections:
            self._leases.setdefault(election, _free(election, terms.get(election, 0)))

    async def observe(
        self, election: str, candidate: Candidate | None = None, ttl: float = 0.0
    ) -> Lease:
        return self._heard(election, candidate, ttl, campaigning=False)

    def _heard(
        self, election: str, candidate: Candidate | None, ttl: float, campaigning: bool
    ) -> Lease:
        if candidate is not None:
            heard = (candidate, ttl, boottime(), dt.datetime.now(dt.UTC), campaigning)
            self._members[election, candidate.node_id, candidate.instance] = heard
        lease = self._leases.setdefault(election, _free(election, term=0))
        return heard_in(replace(lease, members=self._listed(election)), candidate)

    async def acquire_or_renew(self, ask: Ask) -> Lease:
        election, candidate = ask.election, ask.candidate
        lease = self._heard(election, candidate, ask.ttl, campaigning=True)
        if lease.holder is None:
            term = max(lease.term + 1, ask.min_term)
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
            self._began(lease)
            self._wake(election)
        return heard_in(replace(lease, members=self._listed(election)), candidate)

    async def release(self, release: Release) -> None:
        election, term = release.election, release.term
        lease = await self.observe(election)
        if lease.held_by(release.candidate) and lease.term == term:
            # No reservation: no other node can ever ask (the API refuses resign?to=).
            self._leases[election] = _free(election, term=term)
            records = self._history.get(election, [])
            if records and records[0].term == term:
                now = dt.datetime.now(dt.UTC)
                records[0] = replace(records[0], ended_at=now, end_reason=str(release.reason))
                self._save_history()
            self._wake(election)

    async def history(self, election: str, limit: int) -> list[Tenure]:
        return self._history.get(election, [])[:limit]

    async def wait_for_change(self, election: str, timeout: float) -> None:
        event = self._changed.setdefault(election, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    async def close(self) -> None:
        self._wake_all()

    def _listed(self, election: str) -> tuple[Member, ...]:
        now, listed = boottime(), sorted(self._members.items())
        return tuple(
            _member(c, ttl, wall, now - at, asks)
            for (e, _, _), (c, ttl, at, wall, asks) in listed
            if e == election
        )

    def _began(self, lease: Lease) -> None:
        """A term began: record it (a static lease ends by release, or with the process that
        held it: the next acquisition ends that record as "expired")."""
        records = self._history.setdefault(lease.election, [])
        if records and records[0].end_reason is None:
            records[0] = replace(
                records[0], ended_at=lease.acquired_at, end_reason=EndReason.EXPIRED.value
            )
        assert lease.holder is not None
        began = Tenure(lease.election, lease.term, lease.holder, lease.instance, lease.address,
                       lease.acquired_at, None, None)  # fmt: skip
        records.insert(0, began)
        del records[HISTORY_RETENTION:]
        self._save_history()

    def _load_history(self) -> dict[str, list[Tenure]]:
        if self.term_file is None:
            return {}
        try:
            with open(f"{self.term_file}.history.json", encoding="utf-8") as f:
                data = json.load(f)
            return {e: [_tenure(r) for r in records] for e, records in data.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise BackendFatal(
                f"cannot read the static history of {self.term_file}: {exc}"
            ) from exc

    def _save_history(self) -> None:
        if self.term_file is not None:
            data = {e: [_record(r) for r in records] for e, records in self._history.items()}
            self._write(f"{self.term_file}.history.json", data)

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
        self._write(self.term_file, terms)

    @staticmethod
    def _write(path: str, data: Any) -> None:
        """Replace ``path`` with ``data`` as JSON, atomically and durably."""
        temporary = f"{path}.tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as f:
                json.dump(data, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
            directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            raise BackendUnavailable(f"cannot save {path}: {exc.strerror}") from exc

    def _wake(self, election: str) -> None:
        event = self._changed.pop(election, None)
        if event is not None:
            event.set()

    def _wake_all(self) -> None:
        for election in list(self._changed):
            self._wake(election)


def _free(election: str, term: int) -> Lease:
    return Lease(election, holder=None, address="", term=term, acquired_at=None, expires_in=None)


def _record(r: Tenure) -> dict[str, Any]:
    data = asdict(r)
    for key in ("acquired_at", "ended_at"):
        data[key] = data[key].isoformat() if data[key] else None
    return data


def _tenure(data: dict[str, Any]) -> Tenure:
    for key in ("acquired_at", "ended_at"):
        data[key] = dt.datetime.fromisoformat(data[key]) if data[key] else None
    return Tenure(**data)


def _member(c: Candidate, ttl: float, wall: dt.datetime, ago: float, asks: bool) -> Member:
    return Member(c.node_id, c.instance, c.address, c.leaderd_version, ttl, wall, ago,
                  asks, c.priority, c.health, c.switchover)  # fmt: skip
