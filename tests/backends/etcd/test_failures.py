"""What the etcd backend says and does when the cluster fails under it: an unreachable
endpoint, a lost quorum, a whole-cluster restart, a compacted watch revision."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest

from leaderd.backends import Backend, BackendUnavailable, Candidate, backend_from_url
from tests.support.backend_calls import ask, release
from tests.support.etcd_cluster import EtcdCluster, free_port

A, B = Candidate("node-a"), Candidate("node-b")
E = "default"
TTL = 5.0


class Opener:
    def __init__(self, etcd: EtcdCluster, opened: list[Backend]) -> None:
        self.etcd, self.opened = etcd, opened
        self.prefix = f"/leaderd-test/{uuid.uuid4().hex[:10]}/"

    async def __call__(self, url: str | None = None) -> Backend:
        backend = backend_from_url(url or self.etcd.url(prefix=self.prefix))
        self.opened.append(backend)
        await backend.open([E])
        return backend


@pytest.fixture
def new(etcd: EtcdCluster, opened: list[Backend]) -> Opener:
    return Opener(etcd, opened)


async def test_a_dead_endpoint_is_skipped_and_named_when_all_are_dead(
    etcd: EtcdCluster, new: Opener
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    hosts = ",".join([dead, *(m.hostport for m in etcd.members)])
    backend = await new(f"etcd://{hosts}/?prefix={new.prefix}")
    assert (await ask(backend, E, A, TTL, timeout=5)).held_by(A)
    with pytest.raises(BackendUnavailable) as caught:
        await new(f"etcd://{dead}/?prefix={new.prefix}")
    assert str(caught.value) == f"reading the elections: {dead}: connection refused"


async def test_without_quorum_requests_fail_in_one_line_and_the_lease_survives(
    etcd: EtcdCluster, new: Opener
) -> None:
    backend = await new()
    mine = await ask(backend, E, A, TTL, timeout=5)
    for member in etcd.members[1:]:
        etcd.stop(member)
    with pytest.raises(BackendUnavailable) as caught:
        await ask(backend, E, A, TTL, timeout=1.5)
    message = str(caught.value)
    print(f"\nno quorum: {message}")
    assert "\n" not in message and etcd.members[0].hostport in message
    assert "timed out" in message or "no leader" in message
    etcd.ensure_running()
    again = await ask(backend, E, A, TTL, timeout=10)
    assert again.held_by(A) and again.term == mine.term  # etcd kept the lease alive meanwhile
    await release(backend, E, A, again.term)
    assert (await ask(await new(), E, B, TTL, timeout=5)).term == mine.term + 1


async def test_terms_survive_a_restart_of_every_member(etcd: EtcdCluster, new: Opener) -> None:
    backend = await new()
    first = await ask(backend, E, A, TTL, timeout=5)
    await release(backend, E, A, first.term)
    for member in etcd.members:
        etcd.stop(member)
    etcd.ensure_running()
    after = await new()
    assert (await after.observe(E)).term == first.term
    assert (await ask(after, E, B, TTL, timeout=10)).term == first.term + 1


async def test_a_compacted_watch_revision_is_said_and_wakes_the_standby(
    etcd: EtcdCluster, new: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    """The standby's only member goes down; meanwhile the lease changes hands and etcd
    compacts its history: when the member is back, the watch cannot resume where it was."""
    only = etcd.members[0]
    standby = await new(etcd.url(prefix=new.prefix, members=[only]))
    holder = await new(etcd.url(prefix=new.prefix, members=etcd.members[1:]))
    await standby.observe(E)
    waiting = asyncio.create_task(standby.wait_for_change(E, 60))
    await asyncio.sleep(0.3)  # the watch is up
    etcd.stop(only)
    for _ in range(3):
        lease = await ask(holder, E, A, TTL, timeout=5)
        await release(holder, E, A, lease.term)
    revision = etcd.post(etcd.members[1], "/v3/kv/range", {"key": "AA=="})["header"]["revision"]
    etcd.post(etcd.members[1], "/v3/kv/compaction", {"revision": revision, "physical": True})
    caplog.set_level(logging.WARNING, logger="leaderd.backends.etcd")
    restarted = time.monotonic()
    etcd.start(only)
    await asyncio.wait_for(waiting, 20)
    print(f"\nwoken {time.monotonic() - restarted:.2f} s after the member restarted")
    compacted = [r.getMessage() for r in caplog.records if "compacted" in r.getMessage()]
    assert len(compacted) == 1 and "\n" not in compacted[0], caplog.text
    assert (await ask(standby, E, B, TTL, timeout=5)).held_by(B)
