"""etcd one-write hand-over, what is etcd's own (docs/etcd.md; the rules every backend that
grants keeps are tests/backends/test_grant.py): a release puts the leader key under the
heir's spare lease, which the heir offered in its candidate key; a follower names the new
holder from the watch event; an offer withdrawn or a spare gone since the leader read them
grants nothing. On the real 3-member cluster."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from leaderd.backends import Backend, BackendError, Candidate, backend_from_url
from leaderd.backends.records import HISTORY_RETENTION
from tests.support.backend_calls import ask, release
from tests.support.etcd_cluster import EtcdCluster
from tests.support.grants import stand_with_a_spare, wait_grant

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


async def stand(backend: Backend, who: Candidate, ttl: float = TTL) -> None:
    await stand_with_a_spare(backend, E, who, ttl)


async def test_a_grant_puts_the_key_under_the_heirs_spare_and_ends_its_candidacy(
    cluster: Cluster,
) -> None:
    a, b = await cluster.open(), await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await stand(b, B)
    offer = cluster.offer(B)
    assert offer is not None
    await ask(a, E, A, ttl=TTL, timeout=5)  # the leader's renewal reads the offers
    await release(a, E, A, held.term, grant=True)
    assert (await wait_grant(b, E)).lease.term == held.term + 1
    assert cluster.offer(B) is None  # a holder is no candidate
    value, kv = cluster.etcd.get(f"{cluster.prefix}{E}/leader")
    assert value is not None and json.loads(value)["node_id"] == B.node_id
    assert int(kv["lease"]) == int(offer["lease"])  # the key lives on B's spare


async def test_a_standby_that_stood_since_the_leaders_last_read_is_granted(
    cluster: Cluster,
) -> None:
    """A standby started after the leader's last round is known to the leader by its watch
    alone: its offer carries its own ttl, which the heir rule judges it by (the leader's
    member list is as of its last read). Before, such a standby was never granted."""
    a, b = await cluster.open(), await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await stand(b, B)  # after a's last read
    # One stream delivers the prefix's events in order: once a's watch heard b take another
    # election, it had heard b's offer.
    await ask(b, "marker", B, ttl=TTL, timeout=5)
    await a.wait_for_change("marker", 3.0)
    await release(a, E, A, held.term, grant=True, ttl=TTL)
    assert (await wait_grant(b, E)).lease.term == held.term + 1


async def test_a_standby_cooling_down_withdraws_its_offer_and_a_silent_one_keeps_it(
    cluster: Cluster,
) -> None:
    """What the contract suite's stale test stands on: the silent candidate is still
    offered (its spare outlives the silence), so only its silence excludes it."""
    a, b, c = await cluster.open(), await cluster.open(), await cluster.open()
    await ask(a, E, A, ttl=TTL, timeout=5)
    await stand(c, C, ttl=8.0)
    await stand(b, B)
    await b.observe(E, B, TTL)  # cooling down: heard, not campaigning
    await asyncio.sleep(8.0 * 0.6)
    assert cluster.offer(B) is None and cluster.offer(C)


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


async def test_a_grant_leaves_trimming_the_history_to_the_heirs_first_renewal(
    cluster: Cluster,
) -> None:
    """etcd takes about a millisecond over a range delete, which the heir would wait for: a
    grant puts the new term's record only, readers never see a record past the retention,
    and the heir's first renewal deletes those (docs/etcd.md, "History")."""
    a, b = await cluster.open(), await cluster.open()
    first = await ask(a, E, A, ttl=TTL, timeout=5)
    await release(a, E, A, first.term)
    # The term before the one that leaves ``first`` out: its acquisition trims nothing.
    last = first.term + HISTORY_RETENTION - 1
    held = await ask(a, E, A, ttl=TTL, timeout=5, min_term=last)
    assert held.term == last
    await stand(b, B)
    await ask(a, E, A, ttl=TTL, timeout=5)  # its renewal reads B's offer
    await release(a, E, A, held.term, grant=True)
    granted = (await wait_grant(b, E)).lease.term
    assert granted == first.term + HISTORY_RETENTION
    old = [f"{cluster.prefix}{E}/{kind}/{first.term:020d}" for kind in ("history", "ended")]
    assert all(cluster.etcd.get(key)[0] is not None for key in old)  # the grant trimmed none
    assert [r.term for r in await b.history(E, 10)] == [granted, held.term]
    assert (await ask(b, E, B, ttl=TTL, timeout=5)).held_by(B)  # its first renewal
    assert all(cluster.etcd.get(key)[0] is None for key in old)
    assert [r.term for r in await a.history(E, 10)] == [granted, held.term]
