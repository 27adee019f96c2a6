"""kubernetes:// — one coordination.k8s.io/v1 Lease per election, ``<lease-prefix><election>``
in one namespace, on the API server itself: no database (docs/kubernetes.md).

* Every write is a compare-and-swap: an update that names the resourceVersion it was built
  from; a 409 means another write came first, and the request reads and decides again.
* Expiry is judged by the takeover rule only, exactly client-go's: renewTime is written by
  the holder's wall clock and is never compared with ours. A lease is expired for this
  process once it has seen that very resourceVersion unchanged for the holder's duration
  (leaderd's exact ttl, else leaseDurationSeconds) on its own CLOCK_BOOTTIME, counted from
  the answer or watch event that first showed it; the engine names that version to take it.
* The term is the ``leaderd.io/term`` annotation (codec.py): +1 on every acquisition, kept by
  renewals and releases; a missing Lease starts at the wall clock in milliseconds.
* Release clears holderIdentity in place, the term kept, as client-go's ReleaseOnCancel.
* A watch on each election's Lease (watch.py) wakes standbys; members are companion Leases
  (members.py); the history rides in the Lease's own annotation (history.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...clock import boottime
from ..asks import Ask, Release
from ..base import (
    Backend,
    BackendError,
    BackendUnavailable,
    Candidate,
    Capabilities,
    Capability,
    Grant,
    Lease,
    LeaseLost,
)
from ..records import Member, Tenure, end_text
from . import codec, history
from .codec import Record
from .config import KubeSettings
from .members import MemberLeases
from .transport import Conflict, KubeClient
from .watch import LeaseWatch

log = logging.getLogger("leaderd.backends.kubernetes")

DEFAULT_TIMEOUT = 5.0
_RACES = 3


@dataclass(frozen=True)
class Claim:
    """One acquire-or-renew (an Ask) with the instance it gives up at."""

    election: str
    candidate: Candidate
    ttl: float
    give_up: float  # on CLOCK_BOOTTIME
    takeover: str = ""
    min_term: int = 0
    lost_term: int = 0

    def left(self) -> float:
        return max(0.001, self.give_up - boottime())

    @classmethod
    def of(cls, ask: Ask) -> Claim:
        give_up = boottime() + ask.timeout
        return cls(ask.election, ask.candidate, ask.ttl, give_up, ask.takeover, ask.min_term,
                   ask.lost_term)  # fmt: skip


class KubernetesBackend(Backend):
    kind = "kubernetes"
    capabilities = Capabilities(
        {
            Capability.TTL_LEFT: "no server clock judges a Lease: expires_in counts from when "
            "this daemon first saw its resourceVersion, on its own clock (renewTime is the "
            "holder's wall clock and is never trusted)",
            Capability.RESERVES: "a reservation would have to end on a clock: the API server "
            "keeps none for a Lease, and client-go would take the free Lease regardless",
            Capability.GRANTS: "a release cannot hand the Lease to a standby safely: a standby's "
            "liveness would be judged on another host's clock",
        }
    )

    def __init__(self, settings: KubeSettings) -> None:
        self._settings = settings
        self._client = KubeClient(settings)
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{settings.namespace}/leases"
        self._members = MemberLeases(self._client, self._path)
        self._watch = LeaseWatch(self._client, self._path, self._on_event)
        self._names: dict[str, str] = {}
        self._known: dict[str, Record | None] = {}  # the newest object seen (None: absent)
        self._seen: dict[str, tuple[str, float]] = {}  # resourceVersion, first seen (boottime)
        self._held: dict[str, str] = {}  # the resourceVersion our last answer held
        self._renewed: dict[str, tuple[str, Any]] = {}  # that version, and its renewTime
        self._answered: dict[str, int] = {}  # watch events heard when last answered
        self._me: dict[str, Candidate] = {}  # who campaigns in each election

    @classmethod
    def from_url(cls, url: str) -> KubernetesBackend:
        return cls(KubeSettings.from_url(url))

    @property
    def description(self) -> str:
        return self._settings.description

    def _name(self, election: str) -> str:
        if election not in self._names:
            self._names[election] = self._settings.lease_name(election)
        return self._names[election]

    async def open(self, elections: Sequence[str]) -> None:
        """Check every name, start the watches, and create each missing Lease, free, with its
        first term (so kubectl shows every election, and terms start above a deleted one's)."""
        for election in elections:
            self._name(election)
        for election in elections:
            self._watch.start(election, self._name(election))
        for election in elections:
            if await self._get(election, DEFAULT_TIMEOUT) is None:
                with_term = codec.new_lease(self._name(election), codec.first_term())
                with contextlib.suppress(Conflict):  # another daemon created it first
                    await self._write("POST", election, with_term, DEFAULT_TIMEOUT)

    # ---- reading and remembering ----

    async def _get(self, election: str, timeout: float) -> Record | None:
        answer = await self._client.request("GET", f"{self._path}/{self._name(election)}", timeout)
        return self._note(election, None if answer.status == 404 else answer.body)

    async def _write(
        self, method: str, election: str, raw: dict[str, Any], timeout: float
    ) -> Record:
        path = self._path if method == "POST" else f"{self._path}/{self._name(election)}"
        try:
            answer = await self._client.request(method, path, timeout, raw)
        except Conflict:
            self._known.pop(election, None)  # read again before the next write
            raise
        if answer.status == 404:
            self._known.pop(election, None)
            raise Conflict(f"{method} {path}: the Lease was deleted")
        record = self._note(election, answer.body)
        assert record is not None
        return record

    def _note(self, election: str, raw: dict[str, Any] | None) -> Record | None:
        """Remember an object the server showed; a new resourceVersion starts its takeover
        clock now (after the write that made it: never earlier than its holder's send time)."""
        record = codec.decode(raw) if raw is not None else None
        known = self._known.get(election)
        if record is not None and known is not None and _older(record.version, known.version):
            return record  # a watch event behind an answer already noted
        self._known[election] = record
        if record is not None and self._seen.get(election, ("", 0.0))[0] != record.version:
            self._seen[election] = (record.version, boottime())
        return record

    def _on_event(self, election: str, raw: dict[str, Any] | None) -> bool:
        """A watch event: news unless it shows what a request's answer already did."""
        unknown = election not in self._known
        before = self._known.get(election)
        after = self._note(election, raw)
        if unknown or before is None or after is None:
            return unknown or before is not after
        return before.version != after.version

    def _expires_in(self, election: str, record: Record) -> float:
        version, since = self._seen.get(election, ("", boottime()))
        if version != record.version:
            return record.duration
        return max(0.0, since + record.duration - boottime())

    # ---- the interface ----

    async def observe(
        self, election: str, candidate: Candidate | None = None, ttl: float = 0.0
    ) -> Lease:
        record, (members, heartbeat) = await asyncio.gather(
            self._get(election, DEFAULT_TIMEOUT),
            self._heard(election, candidate, ttl, False, DEFAULT_TIMEOUT),
        )
        return self._answer(election, record, members, heartbeat, candidate)

    async def acquire_or_renew(self, ask: Ask) -> Lease:
        self._me[ask.election] = ask.candidate
        return await self.campaign(Claim.of(ask))

    async def campaign(self, ask: Claim) -> Lease:
        """Read (unless what is known may be written on at once), then acquire, renew or
        follow; the member heartbeat goes beside it."""
        record, (members, heartbeat) = await asyncio.gather(
            self._decide(ask), self._heard(ask.election, ask.candidate, ask.ttl, True, ask.left())
        )
        lease = self._answer(ask.election, record, members, heartbeat, ask.candidate)
        if lease.held_by(ask.candidate):
            self._held[ask.election] = record.version if record is not None else ""
            if record is not None:
                self._renewed[ask.election] = (record.version, _renew_time(record))
        else:
            self._held.pop(ask.election, None)
        return lease

    async def _decide(self, ask: Claim) -> Record | None:
        election, me = ask.election, ask.candidate
        for _ in range(_RACES):
            # A free Lease, or our own, may be written on what is known: a stale one is a 409.
            # Another holder's is always read: its answer is what the takeover clock watches.
            record = self._known.get(election)
            if election not in self._known or (
                record is not None and record.holder and not record.mine(me)
            ):
                record = await self._get(election, ask.left())
            try:
                return await self._claim(ask, record)
            except Conflict:
                continue
        raise BackendUnavailable(f"acquiring election {election}: lost {_RACES} races")

    async def _claim(self, ask: Claim, record: Record | None) -> Record | None:
        election, me = ask.election, ask.candidate
        if record is None or record.holder is None:
            return await self._acquire(ask, record)
        expired = self._expires_in(election, record) <= 0
        if record.mine(me):
            if expired:  # our own lease lapsed meanwhile: a new term
                return await self._acquire(ask, record)
            raw = codec.held(
                record,
                self._name(election),
                me,
                ask.ttl,
                record.term,
                codec.micro_time(codec.now_wall()),
            )
            return await self._write("PUT", election, raw, ask.left())
        if expired and ask.takeover and ask.takeover == record.version:
            return await self._acquire(ask, record)
        if ask.lost_term:
            await self._say_lost(ask, record)
        return record

    async def _acquire(self, ask: Claim, record: Record | None) -> Record:
        base = record.term if record is not None else codec.first_term() - 1
        term = max(base + 1, ask.min_term)
        now = codec.micro_time(codec.now_wall())
        tenures = history.acquired(record, ask.candidate, term, now, ask.lost_term)
        raw = codec.held(
            record, self._name(ask.election), ask.candidate, ask.ttl, term, now, tenures
        )
        return await self._write("POST" if record is None else "PUT", ask.election, raw, ask.left())

    async def _say_lost(self, ask: Claim, record: Record) -> None:
        """A term this candidate stepped down from for want of the backend: its record says so
        (best effort: a 409 leaves it to say "taken over")."""
        tenures = history.lost(record, ask.candidate, ask.lost_term)
        if tenures is not None:
            with contextlib.suppress(Conflict):
                raw = codec.with_history(record, tenures)
                await self._write("PUT", ask.election, raw, ask.left())

    async def release(self, release: Release) -> None:
        # Neither reservations nor grants (capabilities): the release frees the Lease.
        reason = end_text(release.reason, release.reserve_for)
        await self.give_back(release.election, release.candidate, release.term, reason,
                             release.version)  # fmt: skip

    async def give_back(
        self, election: str, candidate: Candidate, term: int, reason: str, version: str = ""
    ) -> None:
        """Clear holderIdentity if ``candidate`` holds ``term`` (at ``version``, if named)."""
        give_up = boottime() + DEFAULT_TIMEOUT
        for attempt in range(_RACES):
            record = self._known.get(election)
            if attempt or record is None or not record.mine(candidate):
                record = await self._get(election, max(0.001, give_up - boottime()))
            if record is None or not record.mine(candidate) or record.term != term:
                return
            if (
                version
                and record.version != version
                and not self._renewed_at(election, version, record)
            ):
                if attempt:
                    return  # a renewal moved it: a late release changes nothing
                continue
            now = codec.micro_time(codec.now_wall())
            raw = codec.released(record, now, history.released(record, term, now, reason))
            try:
                await self._write("PUT", election, raw, max(0.001, give_up - boottime()))
            except Conflict:
                continue
            self._held.pop(election, None)
            return

    def _renewed_at(self, election: str, version: str, record: Record) -> bool:
        """``record`` is still the renewal answered at ``version``: only annotations (a
        `run --once-per` record, kubernetes/jobs.py) were written since, never renewTime."""
        return self._renewed.get(election) == (version, _renew_time(record))

    async def wait_for_change(self, election: str, timeout: float) -> Grant | None:
        self._watch.start(election, self._name(election))
        await self._watch.wait(election, self._answered.get(election, 0), timeout)
        self._answered[election] = self._watch.heard(election)
        self._check_held(election)
        return None

    def _check_held(self, election: str) -> None:
        """The watch showed our Lease deleted, or changed to another holder, after the version
        our last answer held: whatever we held is gone (LeaseLost)."""
        held, me = self._held.get(election), self._me.get(election)
        if held is None or me is None or election not in self._known:
            return
        record = self._known[election]
        if record is not None and (record.mine(me) or not _older(held, record.version)):
            return
        del self._held[election]
        if record is None:
            raise LeaseLost(f"the Lease {self._name(election)} was deleted")
        raise LeaseLost(
            f"the Lease {self._name(election)} is now held by "
            f"{record.holder or 'nobody'} (resourceVersion {record.version})"
        )

    async def history(self, election: str, limit: int) -> list[Tenure]:
        record = await self._get(election, DEFAULT_TIMEOUT)
        return codec.tenures(election, record.history if record else (), limit)

    async def close(self) -> None:
        await self._watch.stop()
        await self._client.close()

    # ---- members and answers ----

    async def _heard(
        self, election: str, me: Candidate | None, ttl: float, campaigning: bool, timeout: float
    ) -> tuple[tuple[Member, ...], dt.datetime | None]:
        return await self._members.heard(self._name(election), me, ttl, campaigning, timeout)

    def _answer(
        self,
        election: str,
        record: Record | None,
        members: tuple[Member, ...],
        heartbeat: dt.datetime | None,
        me: Candidate | None,
    ) -> Lease:
        self._answered[election] = self._watch.heard(election)  # news up to here is in it
        if record is None or record.holder is None:
            term = record.term if record is not None else 0
            return Lease(election, None, "", term, None, None, members=members, heartbeat=heartbeat)
        return Lease(
            election,
            record.holder,
            record.address,
            record.term,
            record.acquired_at,
            self._expires_in(election, record),
            instance=record.instance,
            version=record.version,
            members=members,
            heartbeat=heartbeat,
        )


def _renew_time(record: Record) -> Any:
    return (record.raw.get("spec") or {}).get("renewTime")


def _older(version: str, than: str) -> bool:
    """resourceVersions are opaque; the API server's are etcd revisions, so compare those."""
    return version.isdigit() and than.isdigit() and int(version) < int(than)


__all__ = ["BackendError", "KubernetesBackend"]
