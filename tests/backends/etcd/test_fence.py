"""etcd refuses a stale leader's put (docs/fencing.md): examples/fencing/etcd-fenced-put.sh,
the real etcdctl txn comparing the leader key's mod revision, on the suite's 3-member
cluster."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from leaderd.backends import Backend, Candidate, backend_from_url
from leaderd.backends.asks import Ask, Release
from tests.support.etcd_cluster import EtcdCluster

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
E = "default"
SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "fencing" / "etcd-fenced-put.sh"


class Election:
    def __init__(self, etcd: EtcdCluster) -> None:
        self.etcd = etcd
        self.prefix = f"/leaderd-test/{uuid.uuid4().hex[:10]}/"
        self.key = f"/fenced-test/{uuid.uuid4().hex[:10]}"

    def put(self, term: int, value: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "ETCDCTL_ENDPOINTS": self.etcd.endpoints,
               "LEADERD_PREFIX": self.prefix, "LEADERD_TERM": str(term)}  # fmt: skip
        return subprocess.run([str(SCRIPT), self.key, value], env=env, capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip

    def value(self) -> str | None:
        value, _ = self.etcd.get(self.key)
        return None if value is None else value.decode()

    def txn(self, tenure: str, value: str) -> subprocess.CompletedProcess[str]:
        """The example's fenced put on ``tenure``, as one real ``etcdctl txn``."""
        txn = f'mod("{self.prefix}{E}/leader") = "{tenure}"\n\nput {self.key} "{value}"\n\n\n'
        return subprocess.run(["etcdctl", f"--endpoints={self.etcd.endpoints}", "txn"], input=txn,
                              env={**os.environ, "ETCDCTL_API": "3"}, capture_output=True,
                              text=True, timeout=30, check=True)  # fmt: skip

    def tenure(self) -> str:
        _, kv = self.etcd.get(f"{self.prefix}{E}/leader")
        return str(kv["mod_revision"])


@pytest.fixture
async def election(etcd: EtcdCluster) -> AsyncIterator[tuple[Election, Backend, Backend]]:
    e = Election(etcd)
    a, b = backend_from_url(etcd.url(prefix=e.prefix)), backend_from_url(etcd.url(prefix=e.prefix))
    await a.open([E])
    await b.open([E])
    yield e, a, b
    await a.close()
    await b.close()


async def lead(backend: Backend, who: Candidate) -> int:
    lease = await backend.acquire_or_renew(Ask(E, who, 10, 5))
    assert lease.held_by(who), lease
    return lease.term


async def test_a_stale_leaders_put_after_a_hand_over_is_refused_the_new_leaders_succeeds(
    election: tuple[Election, Backend, Backend],
) -> None:
    e, a, b = election
    old = await lead(a, A)
    assert e.put(old, "by-node-a").returncode == 0
    await a.release(Release(E, A, old))
    refused = e.put(old, "stale")
    assert refused.returncode == 1 and "does not lead" in refused.stderr
    new = await lead(b, B)
    assert e.put(old, "stale").returncode == 1
    written = e.put(new, "by-node-b")
    assert written.returncode == 0, written.stderr
    assert e.value() == "by-node-b"


async def test_a_put_racing_the_hand_over_fails_on_the_tenure_it_read(
    election: tuple[Election, Backend, Backend],
) -> None:
    """The read of the tenure, then a hand-over, then the transaction (the example's two
    steps, with the hand-over forced between them): etcd refuses the put."""
    e, a, b = election
    old = await lead(a, A)
    tenure = e.tenure()
    await a.release(Release(E, A, old))
    await lead(b, B)
    answer = e.txn(tenure, "racing")
    assert answer.stdout.startswith("FAILURE"), answer.stdout
    assert e.value() is None
