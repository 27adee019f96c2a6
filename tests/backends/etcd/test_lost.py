"""A holder whose key etcd deletes under it steps down at the watch event (docs/etcd.md,
"A lease etcd revokes while it is kept alive"); a stale holder never touches the key it
granted. On the real 3-member cluster.

etcd can revoke a lease that a client keeps alive: a raft leader that was paused past the
lease's ttl (SIGSTOP, a stalled disk, a starved CPU) revokes every lease it thinks expired
when it resumes, even once it is no longer leader (etcd issues 15247 and 12528; Debian's
3.4.23 does it here in about 1 resume of 8). The tests revoke the lease by hand, which is
the same event on the wire.
"""

from __future__ import annotations

import asyncio
import base64

from leaderd.backends import Backend, Candidate
from leaderd.backends.base import LeaseLost
from tests.backends.etcd.test_grant import Cluster, stand
from tests.backends.etcd.test_grant import cluster as cluster  # the fixture
from tests.support.backend_calls import ask, release
from tests.support.grants import wait_grant

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
E = "default"
TTL = 4.0


def leader_key(cluster: Cluster) -> dict[str, str]:
    value, kv = cluster.etcd.get(f"{cluster.prefix}{E}/leader")
    assert value is not None, "no leader key"
    return kv


def revoke(cluster: Cluster) -> None:
    """What a resumed etcd leader does to a lease it thinks expired."""
    lease = int(leader_key(cluster)["lease"])
    cluster.etcd.post(cluster.etcd.members[0], "/v3/kv/lease/revoke", {"ID": lease})


async def lost(backend: Backend) -> LeaseLost:
    """What ``backend``'s waiter raises within 3 s (a wait may end early: the contract)."""
    async with asyncio.timeout(3):
        while True:
            try:
                await backend.wait_for_change(E, 1.0)
            except LeaseLost as exc:
                return exc


async def changes_only(backend: Backend, seconds: float) -> None:
    """Waits for ``seconds``, every one of which must end without raising."""
    end = asyncio.get_running_loop().time() + seconds
    while (left := end - asyncio.get_running_loop().time()) > 0:
        await backend.wait_for_change(E, left)


def delete(cluster: Cluster) -> None:
    key = base64.b64encode(f"{cluster.prefix}{E}/leader".encode()).decode()
    cluster.etcd.post(cluster.etcd.members[0], "/v3/kv/deleterange", {"key": key})


async def test_a_revoked_lease_is_lost_at_the_watch_event(cluster: Cluster) -> None:
    a = await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    revoke(cluster)
    said = str(await lost(a))
    assert said.startswith("etcd deleted the leader key at revision ")
    assert "its lease was revoked" in said
    await changes_only(a, 0.3)  # told once
    again = await ask(a, E, A, ttl=TTL, timeout=5)
    assert again.held_by(A) and again.term == held.term + 1


async def test_a_granted_key_deleted_by_hand_is_lost_at_the_watch_event(cluster: Cluster) -> None:
    """The heir's hold came from a watch event, not an answer of its own: its key is
    watched from then on too."""
    a, b = await cluster.open(), await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await stand(b, B)
    await ask(a, E, A, ttl=TTL, timeout=5)  # the leader reads the offer
    await release(a, E, A, held.term, grant=True, ttl=TTL)
    assert (await wait_grant(b, E)).lease.held_by(B)
    await changes_only(a, 0.3)  # the granter released: nothing to lose
    delete(cluster)
    await lost(b)


async def test_a_standby_hears_a_deleted_key_as_a_change(cluster: Cluster) -> None:
    a, b = await cluster.open(), await cluster.open()
    await ask(a, E, A, ttl=TTL, timeout=5)
    assert not (await ask(b, E, B, ttl=TTL, timeout=5)).held_by(B)
    revoke(cluster)
    await changes_only(b, 1.0)
    assert (await b.observe(E)).holder is None


async def test_a_stale_holder_cannot_delete_the_key_it_granted(cluster: Cluster) -> None:
    """A grant's put keeps the key's create revision: a release conditioned on it would
    delete the successor's key. The release is conditioned on the mod revision."""
    a, b = await cluster.open(), await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await stand(b, B)
    await ask(a, E, A, ttl=TTL, timeout=5)
    known = a._election(E)  # type: ignore[attr-defined]
    before = known.state
    await release(a, E, A, held.term, grant=True, ttl=TTL)
    assert (await wait_grant(b, E)).lease.held_by(B)
    granted = leader_key(cluster)
    # As if the grant's answer had been lost: A still believes it holds the key.
    known.state = before
    await release(a, E, A, held.term)
    assert leader_key(cluster)["mod_revision"] == granted["mod_revision"]
    assert (await ask(b, E, B, ttl=TTL, timeout=5)).held_by(B)
