"""etcd one-write hand-over (docs/algorithm.md, "One-write hand-over"; docs/etcd.md): a release
puts the leader key under the freshest live candidate's spare lease with the next term, and
that standby hears of it by its watch, with the round whose keepalive of the spare its
expiry counts from. On the real 3-member cluster."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid

import pytest

from leaderd.backends import Backend, BackendError, Candidate, backend_from_url
from tests.backend_calls import ask, release
from tests.etcd.cluster import EtcdCluster
from tests.grants import heard, wait_grant

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
C = Candidate("node-c", "10.0.0.3:80")
E = "default"
TTL = 4.0


class Cluster:
    """Backends on one fresh prefix of the shared cluster."""

    def __init__(self, etcd: EtcdCluster, opened: list[Backend]) -> None:
        self.etcd, self.opened = etcd, opened
        self.prefix = f"/leaderd-test/{uuid.uuid4().hex[:10]}/"

    async def open(self) -> Backend:
        backend = backend_from_url(self.etcd.url(prefix=self.prefix))
        self.opened.append(backend)
        await backend.open([E])
        return backend

    def offer(self, who: Candidate) -> dict[str, str] | None:
        """The candidate key of ``who``: the spare lease it offers."""
        value, _ = self.etcd.get(f"{self.prefix}{E}/candidates/{who.node_id}/{who.instance}")
        return None if value is None else dict(json.loads(value))


@pytest.fixture
def cluster(etcd: EtcdCluster, opened: list[Backend]) -> Cluster:
    return Cluster(etcd, opened)


async def stand(backend: Backend, who: Candidate, ttl: float = TTL) -> dt.datetime:
    """Two follower rounds: the first grants a spare, the second offers it. The heartbeat
    of the first, which the spare's expiry counts from."""
    first = heard(await ask(backend, E, who, ttl=ttl, timeout=5), who)
    await ask(backend, E, who, ttl=ttl, timeout=5)
    return first


async def test_a_release_grants_the_freshest_candidate_the_next_term(cluster: Cluster) -> None:
    a, b, c = await cluster.open(), await cluster.open(), await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await stand(c, C)
    await ask(a, E, A, ttl=TTL, timeout=5)  # the leader's renewal reads the offers
    await asyncio.sleep(0.2)
    b_kept = await stand(b, B)  # the freshest, as the leader's next renewal sees it
    assert cluster.offer(B) is not None
    await ask(a, E, A, ttl=TTL, timeout=5)
    await release(a, E, A, held.term, grant=True, ttl=TTL)
    grant = await wait_grant(b, E)
    assert grant.heard_at == b_kept and grant.lease.held_by(B)
    assert grant.lease.term == held.term + 1
    assert grant.lease.expires_in is not None and grant.lease.expires_in >= TTL
    assert cluster.offer(B) is None  # a holder is no candidate
    seen = await c.observe(E)
    assert seen.holder == B.node_id and seen.term == held.term + 1
    # B's own renewal keeps the granted term on the same lease; history tells the hand-over.
    renewed = await ask(b, E, B, ttl=TTL, timeout=5)
    assert renewed.held_by(B) and renewed.term == grant.lease.term
    assert await b.wait_for_change(E, 0.3) is None  # told once
    records = await c.history(E, 10)
    assert [(r.term, r.holder, r.end_reason) for r in records] == [
        (held.term + 1, B.node_id, None),
        (held.term, A.node_id, "released"),
    ]


async def test_a_follower_names_the_successor_from_the_watch_event_then_reads_again(
    cluster: Cluster,
) -> None:
    """The standby that was not granted hears of the grant by its watch and names the new
    holder in its next round without a request: it answers with every etcd member frozen.
    Once: the round after reads again, and fails while etcd cannot answer (rule 5)."""
    a, b, c = await cluster.open(), await cluster.open(), await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await stand(c, C)
    await stand(b, B)
    await ask(a, E, A, ttl=TTL, timeout=5)  # the leader reads the offers
    waiting = asyncio.create_task(c.wait_for_change(E, 3.0))
    await asyncio.sleep(0.1)
    await release(a, E, A, held.term, grant=True, ttl=TTL)
    assert await waiting is None  # a change, not a grant: B is the freshest
    await wait_grant(b, E)
    members = cluster.etcd.members
    for member in members:
        cluster.etcd.pause(member)
    try:
        async with asyncio.timeout(1):
            named = await ask(c, E, C, ttl=TTL, timeout=2)
        assert named.holder == B.node_id and named.term == held.term + 1
        with pytest.raises((BackendError, TimeoutError)):
            async with asyncio.timeout(2):
                await ask(c, E, C, ttl=TTL, timeout=1)
    finally:
        for member in members:
            cluster.etcd.resume(member)


async def test_a_released_grant_frees_the_lease_and_terms_go_on(cluster: Cluster) -> None:
    a, b = await cluster.open(), await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await stand(b, B)
    await ask(a, E, A, ttl=TTL, timeout=5)
    await release(a, E, A, held.term, grant=True, ttl=TTL)
    grant = await wait_grant(b, E)
    await release(b, E, B, grant.lease.term)
    again = await ask(a, E, A, ttl=TTL, timeout=5, min_term=grant.lease.term + 1)
    assert again.held_by(A) and again.term == grant.lease.term + 1


async def test_no_grant_to_a_withdrawn_stale_or_twin_candidate(cluster: Cluster) -> None:
    a, b, c, d = [await cluster.open() for _ in range(4)]
    twin = Candidate(A.node_id, A.address)  # the same node id, another process
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await stand(b, B)
    await stand(c, C, ttl=8.0)  # its spare outlives the test, not half its ttl of silence
    await stand(d, twin)
    for _ in range(5):  # C, silent for over half its own ttl, goes stale; the others do not
        await asyncio.sleep(TTL / 4)
        await b.observe(E, B, TTL)  # cooling down: heard, not campaigning
        await ask(d, E, twin, ttl=TTL, timeout=5)
        await ask(a, E, A, ttl=TTL, timeout=5)
    assert cluster.offer(B) is None and cluster.offer(C) and cluster.offer(twin)
    await release(a, E, A, held.term, grant=True, ttl=TTL)
    released = await b.observe(E)
    assert released.holder is None and released.term == held.term


async def test_no_grant_to_a_candidate_that_withdrew_after_the_leader_read(
    cluster: Cluster,
) -> None:
    a, b = await cluster.open(), await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await stand(b, B)
    await ask(a, E, A, ttl=TTL, timeout=5)  # the leader reads B's offer
    await b.observe(E, B, TTL)  # a stopping standby's last heartbeat withdraws it
    await release(a, E, A, held.term, grant=True, ttl=TTL)
    released = await b.observe(E)
    assert released.holder is None and released.term == held.term


async def test_a_candidate_whose_spare_is_gone_is_not_granted(cluster: Cluster) -> None:
    a, b = await cluster.open(), await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await stand(b, B)
    await ask(a, E, A, ttl=TTL, timeout=5)
    offer = cluster.offer(B)
    assert offer is not None
    cluster.etcd.etcdctl("lease", "revoke", format(int(offer["lease"]), "x"))
    await release(a, E, A, held.term, grant=True, ttl=TTL)
    released = await a.observe(E)
    assert released.holder is None and released.term == held.term
    taken = await ask(b, E, B, ttl=TTL, timeout=5)  # B grants itself a new spare
    assert taken.held_by(B) and taken.term == held.term + 1


async def test_a_release_with_a_reservation_grants_nothing(cluster: Cluster) -> None:
    a, b = await cluster.open(), await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await stand(b, B)
    await ask(a, E, A, ttl=TTL, timeout=5)
    await release(a, E, A, held.term, reserve_for=C.node_id, ttl=TTL, grant=True)
    reserved = await b.observe(E)
    assert reserved.holder is None and reserved.reserved_for == C.node_id
