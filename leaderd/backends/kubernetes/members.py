"""Members as companion Leases: one per daemon process, ``<lease>-member-<instance>``, labelled
with the election's Lease so that one list finds them all (docs/kubernetes.md, "Members").

Never annotations on the election's Lease: a follower's heartbeat would move its
resourceVersion, and a holder that died would never be seen unchanged for one ttl. Each
heartbeat is one merge patch (a create the first time); the list that answers it has the
patch's own answer in place of the listed copy, so the answer names exactly the heartbeat it
wrote. Members silent for PRUNE_AFTER_TTLS of their ttl are deleted, conditioned on the
resourceVersion that was listed, so a member that spoke meanwhile stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import math
import urllib.parse
from typing import Any

import orjson

from ..base import BackendError, Candidate
from ..records import PRUNE_AFTER_TTLS, Member
from .codec import micro_time, now_wall, parse_time
from .transport import KubeClient

MEMBER_OF = "leaderd.io/member-of"
MEMBER = "leaderd.io/member"


def member_label(lease: str) -> str:
    """A label value naming the election's Lease (a Lease name may be too long for one)."""
    return hashlib.sha256(lease.encode()).hexdigest()[:32]


class MemberLeases:
    def __init__(self, client: KubeClient, leases_path: str) -> None:
        self._client = client
        self._path = leases_path  # /apis/coordination.k8s.io/v1/namespaces/NS/leases

    async def heartbeat(
        self, lease: str, candidate: Candidate, ttl: float, campaigning: bool, timeout: float
    ) -> dict[str, Any]:
        """Write this process's heartbeat; its Lease as the server answered."""
        name = f"{lease}-member-{candidate.instance}"
        info = {
            "node": candidate.node_id,
            "instance": candidate.instance,
            "address": candidate.address,
            "version": candidate.leaderd_version,
            "ttl": ttl,
            "campaigning": campaigning,
            "priority": candidate.priority,
            "health": candidate.health,
            "switchover": candidate.switchover,
        }
        body = {
            "metadata": {
                "name": name,
                "labels": {MEMBER_OF: member_label(lease)},
                "annotations": {MEMBER: orjson.dumps(info).decode()},
            },
            "spec": {
                "holderIdentity": candidate.node_id,
                "renewTime": micro_time(now_wall()),
                "leaseDurationSeconds": max(1, math.ceil(ttl)),
            },
        }
        answer = await self._client.request("PATCH", f"{self._path}/{name}", timeout, body, True)
        if answer.status == 404:
            body |= {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
            answer = await self._client.request("POST", self._path, timeout, body)
        return dict(answer.body)

    async def heard(
        self, lease: str, me: Candidate | None, ttl: float, campaigning: bool, timeout: float
    ) -> tuple[tuple[Member, ...], dt.datetime | None]:
        """Write our heartbeat (if ``me``) beside the listing, and prune the long silent: the
        members and the heartbeat this very request wrote. A failure here costs the member
        list, never the lease's answer."""
        requests: list[Any] = [self.listed(lease, timeout)]
        if me is not None:
            requests.append(self.heartbeat(lease, me, ttl, campaigning, timeout))
        got = await asyncio.gather(*requests, return_exceptions=True)
        items = got[0] if isinstance(got[0], list) else []
        mine = got[1] if len(got) > 1 and isinstance(got[1], dict) else None
        mine_name = ((mine or {}).get("metadata") or {}).get("name")
        items = [i for i in items if (i.get("metadata") or {}).get("name") != mine_name]
        now = now_wall()
        listed = [(i, member_of(i, now)) for i in items]
        members = [m for _, m in listed if m is not None]
        silent = [i for i, m in listed if m is not None and stale(m)]
        heartbeat = None
        own = member_of(mine, now) if mine is not None else None
        if own is not None:
            members.append(own)
            heartbeat = own.heard_at
        if silent:
            await self.prune(silent, timeout)
        members.sort(key=lambda m: (m.node_id, m.instance))
        return tuple(members), heartbeat

    async def listed(self, lease: str, timeout: float) -> list[dict[str, Any]]:
        selector = urllib.parse.quote(f"{MEMBER_OF}={member_label(lease)}")
        answer = await self._client.request(
            "GET", f"{self._path}?labelSelector={selector}", timeout
        )
        items = answer.body.get("items") or []
        return [item for item in items if isinstance(item, dict)]

    async def prune(self, stale: list[dict[str, Any]], timeout: float) -> None:
        """Delete members silent too long, each only as it was listed."""

        async def delete(item: dict[str, Any]) -> None:
            meta = item.get("metadata") or {}
            body = {"preconditions": {"resourceVersion": meta.get("resourceVersion")}}
            path = f"{self._path}/{meta.get('name')}"
            with contextlib.suppress(BackendError):  # spoke meanwhile (409), or pruned later
                await self._client.request("DELETE", path, timeout, body)

        await asyncio.gather(*(delete(item) for item in stale))


def member_of(item: dict[str, Any], now: dt.datetime) -> Member | None:
    """The Member a member Lease describes; None for a Lease that is not one."""
    meta = item.get("metadata") or {}
    try:
        info = orjson.loads((meta.get("annotations") or {}).get(MEMBER) or "{}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(info, dict) or "instance" not in info:
        return None
    heard_at = parse_time((item.get("spec") or {}).get("renewTime"))
    # Two hosts' wall clocks: for display and pruning only, never for leadership.
    ago = max(0.0, (now - heard_at).total_seconds()) if heard_at is not None else math.inf
    return Member(
        str(info.get("node", "")),
        str(info["instance"]),
        str(info.get("address", "")),
        str(info.get("version", "")),
        float(info.get("ttl", 0.0)),
        heard_at,
        ago,
        bool(info.get("campaigning", False)),
        int(info.get("priority", 1)),
        str(info.get("health", "")),
        str(info.get("switchover", "")),
    )


def stale(member: Member) -> bool:
    return member.heard_ago >= PRUNE_AFTER_TTLS * member.ttl
