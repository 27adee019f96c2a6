"""A release a standby reads before its watch delivers it (docs/etcd.md, "A lease etcd
revokes while it is kept alive").

A standby's round reads the election in a transaction that also puts its heartbeat, so the
read's revision is past the release's. Seen by that read first, the key's absence named no
release: the standby fenced the released key for the holder's whole ttl. (A loaded run of
the contract suite: `test_history_keeps_the_newest_records_past_its_retention[etcd]`.) The
watch's events are held back here, as a late watch would deliver them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from leaderd.backends import Backend, Candidate, backend_from_url
from leaderd.backends.asks import Ask, Release
from leaderd.backends.etcd.backend import EtcdBackend
from tests.support.etcd_cluster import EtcdCluster

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
C = Candidate("node-c", "10.0.0.3:80")
E = "default"
TTL = 60.0  # the fence would last about this long: far past the test's own timeout


class HeldWatch:
    """Holds back the watch events of ``backend`` until ``deliver()``."""

    def __init__(self, backend: Backend) -> None:
        assert isinstance(backend, EtcdBackend)
        self.watch = backend._watch
        self.on_event = self.watch._on_event
        self.held: list[tuple[str, dict[str, Any] | None, int]] = []
        self.watch._on_event = self._hold

    def _hold(self, key: str, kv: dict[str, Any] | None, revision: int) -> str | None:
        self.held.append((key, kv, revision))
        return None

    def deliver(self) -> None:
        self.watch._on_event = self.on_event
        for event in self.held:
            self.on_event(*event)


@pytest.fixture
async def backends(etcd: EtcdCluster) -> AsyncIterator[tuple[EtcdCluster, str, list[Backend]]]:
    prefix = f"/leaderd-test/{uuid.uuid4().hex[:10]}/"
    opened = [backend_from_url(etcd.url(prefix=prefix)) for _ in range(3)]
    for backend in opened:
        await backend.open([E])
    yield etcd, prefix, opened
    for backend in opened:
        await backend.close()


async def round_of(backend: Backend, who: Candidate) -> Any:
    return await backend.acquire_or_renew(Ask(E, who, TTL, TTL / 2))


async def test_a_release_read_before_its_watch_event_is_taken_at_once(
    backends: tuple[EtcdCluster, str, list[Backend]],
) -> None:
    _, _, (a, b, _) = backends
    term = (await round_of(b, B)).term
    assert (await round_of(a, A)).holder == B.node_id  # a knows b leads
    late = HeldWatch(a)
    await b.release(Release(E, B, term))
    lease = await round_of(a, A)
    assert lease.held_by(A), f"a released key was fenced: {lease}"
    late.deliver()
    assert (await round_of(a, A)).held_by(A)


async def test_a_key_deleted_after_a_later_term_is_still_fenced(
    backends: tuple[EtcdCluster, str, list[Backend]],
) -> None:
    """The release a stale view names is not the deletion's cause: b released, c took the
    next term, and c's key was deleted by hand (no release). a, whose watch still names
    b, must wait as for any unexplained deletion."""
    etcd, prefix, (a, b, c) = backends
    term = (await round_of(b, B)).term
    assert (await round_of(a, A)).holder == B.node_id
    late = HeldWatch(a)
    await b.release(Release(E, B, term))
    assert (await round_of(c, C)).held_by(C)
    etcd.etcdctl("del", f"{prefix}{E}/leader")
    lease = await round_of(a, A)
    assert not lease.held_by(A), "a took a key whose deletion no release explains"
    late.deliver()
