"""A standby and a key etcd deleted under a live holder (docs/etcd.md, "A lease etcd revokes
while it is kept alive"): it waits out the holder's deadline, one ttl after it last saw the
holder's heartbeat, before its transaction; a released key it takes at once. On the real
3-member cluster, with the lease revoked by hand as a resumed raft leader revokes it.
"""

from __future__ import annotations

from leaderd.backends.base import Backend
from leaderd.clock import boottime
from tests.backends.etcd.test_grant import Cluster
from tests.backends.etcd.test_grant import cluster as cluster  # the fixture
from tests.backends.etcd.test_lost import A, B, E, changes_only, revoke
from tests.support.backend_calls import ask, release

TTL = 4.0


async def heard_free(standby: Backend) -> None:
    """Until the standby's watch has told it the key is gone."""
    while standby._election(E).state.holder is not None:  # type: ignore[attr-defined]
        await standby.wait_for_change(E, 1.0)


async def test_a_standby_takes_a_revoked_key_only_a_ttl_after_the_holders_heartbeat(
    cluster: Cluster,
) -> None:
    a, b = await cluster.open(), await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    assert not (await ask(b, E, B, ttl=TTL, timeout=5)).held_by(B)
    sent = boottime()
    await ask(a, E, A, ttl=TTL, timeout=5)  # the holder's last renewal: its deadline's start
    await changes_only(b, 0.3)  # the standby sees its heartbeat
    revoke(cluster)
    await heard_free(b)
    early = await ask(b, E, B, ttl=TTL, timeout=5)
    assert early.holder is None, "a standby took the key while the holder's deadline was ahead"
    taken = early
    while taken.holder is None:  # the engine's rounds: each may block up to its wait
        taken = await ask(b, E, B, ttl=TTL, timeout=5, wait=0.5)
    assert taken.held_by(B) and taken.term == held.term + 1
    assert boottime() >= sent + TTL  # the holder's deadline had passed, on any clock


async def test_a_standby_takes_a_released_key_at_once(cluster: Cluster) -> None:
    a, b = await cluster.open(), await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    assert not (await ask(b, E, B, ttl=TTL, timeout=5)).held_by(B)
    await release(a, E, A, held.term)
    await heard_free(b)
    taken = await ask(b, E, B, ttl=TTL, timeout=5)
    assert taken.held_by(B) and taken.term == held.term + 1
