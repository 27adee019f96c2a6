"""The job record stores (backends/jobs.py) on every backend that keeps one: a real SQLite
file, the suite's real PostgreSQL (lease table and advisory lock), etcd cluster and
kube-apiserver. A start is recorded only by the lease's holder with its term, unexpired, and
only on the record as read (at most one start follows any record)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from leaderd.backends import Backend, Candidate, backend_from_url
from leaderd.backends.asks import Ask, Release
from leaderd.backends.base import LeaseLost
from leaderd.backends.jobs import JobStore, RunStatus, job_store_from_url
from tests.support.etcd_fixtures import etcd_cluster  # noqa: F401 - the fixture the etcd store uses
from tests.support.kube_fixtures import kube  # noqa: F401 - the fixture the kubernetes one uses
from tests.support.pgserver import PgServer

E = "default"
A, B = Candidate("node-a"), Candidate("node-b")
ADVISORY = [
    pytest.param("postgresql+advisory", marks=pytest.mark.postgres),
    pytest.param("postgresql+advisory-immediate", marks=pytest.mark.postgres),
]
BACKENDS = [
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.postgres),
    *ADVISORY,
    "etcd",
    pytest.param("kubernetes", marks=pytest.mark.kubernetes),
]
# Where a store reads the lease before its conditional write, the method a race is forced
# after (the lease changes hands between the read and the write).
READS = {"etcd": "_read", "kubernetes": "_get"}


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    name = request.param
    request.node.backend_name = name
    if name == "sqlite":
        return f"sqlite://{tmp_path}/lease.db"
    if name == "etcd":
        cluster = request.getfixturevalue("etcd_cluster")
        return str(cluster.url(prefix=f"/leaderd-jobs/{uuid.uuid4().hex[:10]}/"))
    if name == "kubernetes":
        kubeconfig = request.getfixturevalue("kube").restricted.kubeconfig(
            str(tmp_path / "restricted.kubeconfig")
        )
        prefix = f"j{uuid.uuid4().hex[:10]}-"
        return f"kubernetes:///leaderd-test?lease-prefix={prefix}&kubeconfig={kubeconfig}"
    pg: PgServer = request.getfixturevalue("pg_server")
    if name == "postgresql":
        return pg.dsn(table=f"jobs_{uuid.uuid4().hex[:8]}")
    takeover = {"takeover": "immediate"} if name.endswith("-immediate") else {}
    return pg.dsn(scheme="postgresql+advisory", table=f"ajobs_{uuid.uuid4().hex[:8]}", **takeover)


@pytest.fixture
async def opened(url: str) -> AsyncIterator[tuple[Backend, Backend, JobStore]]:
    a, b = backend_from_url(url), backend_from_url(url)
    await a.open([E])
    await b.open([E])
    store = job_store_from_url(url)
    await store.open()
    yield a, b, store
    await store.close()
    await a.close()
    await b.close()


async def lead(backend: Backend, who: Candidate, ttl: float = 30) -> int:
    lease = await backend.acquire_or_renew(Ask(E, who, ttl, 5))
    assert lease.held_by(who), lease
    return lease.term


async def test_only_the_holder_with_its_term_records_a_start(
    opened: tuple[Backend, Backend, JobStore],
) -> None:
    a, _b, store = opened
    assert (await store.read(E)).runs == 0
    term = await lead(a, A)
    assert (await store.start(E, B, term, 0)).runs == 0  # not the holder
    assert (await store.start(E, A, term + 1, 0)).runs == 0  # not its term
    started = await store.start(E, A, term, 0)
    assert (started.runs, started.term, started.started_by) == (1, term, "node-a")
    assert started.status is RunStatus.RUNNING and started.started_at is not None
    assert started.first_started_at == started.started_at


async def test_at_most_one_start_follows_a_record(
    opened: tuple[Backend, Backend, JobStore],
) -> None:
    a, b, store = opened
    old = await lead(a, A)
    await store.start(E, A, old, 0)
    again = await store.start(E, A, old, 0)  # the same record read twice: one start only
    assert again.runs == 1
    await a.release(Release(E, A, old))
    new = await lead(b, B)
    assert (await store.start(E, A, old, 1)).runs == 1  # the old term: refused
    assert (await store.start(E, B, new, 0)).runs == 1  # a stale read of the record: refused
    assert (await store.start(E, B, new, 1)).runs == 2


async def lapse(holder: Backend) -> None:
    """Wait until a lease taken with ttl 0.5 is over on the backend's clock: etcd's lessor
    counts whole seconds, at least its minimum, and then deletes the key."""
    await asyncio.sleep(0.7)
    async with asyncio.timeout(15):
        # Only etcd is asked: elsewhere a read right at the lapse races the server ending the
        # idle session (idle_session_timeout, advisory), which fails that one read.
        while holder.kind == "etcd" and (await holder.observe(E)).holder is not None:
            with contextlib.suppress(LeaseLost):
                await holder.wait_for_change(E, 0.5)


async def test_a_lapsed_lease_records_no_start(opened: tuple[Backend, Backend, JobStore]) -> None:
    a, _b, store = opened
    term = await lead(a, A, ttl=0.5)
    await lapse(a)
    assert (await store.start(E, A, term, 0)).runs == 0


def after_first(store: JobStore, name: str, then: Callable[[], Awaitable[None]]) -> None:
    """Force the race: ``then`` runs right after the store's first read of the lease (before
    its conditional write), where the store reads first; at once where the start is one
    statement."""
    method = READS.get(name)
    if method is None:
        return
    read = getattr(store, method)
    done: list[bool] = []

    async def read_then(*args: Any) -> Any:
        answer = await read(*args)
        if not done:
            done.append(True)
            await then()
        return answer

    setattr(store, method, read_then)


async def test_a_holder_that_lost_the_lease_meanwhile_records_no_start(
    opened: tuple[Backend, Backend, JobStore], request: pytest.FixtureRequest
) -> None:
    a, b, store = opened
    old = await lead(a, A)
    assert (await store.read(E)).runs == 0  # the runner read the record while leading
    terms: list[int] = []

    async def taken_over() -> None:
        await a.release(Release(E, A, old))
        terms.append(await lead(b, B))

    name = request.node.backend_name
    if name in READS:
        after_first(store, name, taken_over)
    else:
        await taken_over()
    refused = await store.start(E, A, old, 0)  # the lease was read held: then B took it
    assert refused.runs == 0, refused
    assert (await store.start(E, B, terms[0], 0)).runs == 1


async def test_renewals_keep_the_record(opened: tuple[Backend, Backend, JobStore]) -> None:
    a, _b, store = opened
    term = await lead(a, A)
    await store.start(E, A, term, 0)
    for _ in range(3):
        assert await lead(a, A) == term
    kept = await store.read(E)
    assert (kept.runs, kept.term, kept.status) == (1, term, RunStatus.RUNNING)
    await store.finish(E, 1, RunStatus.SUCCEEDED, 0)
    assert await lead(a, A) == term  # a job's write never costs the holder its lease
    assert (await store.read(E)).status is RunStatus.SUCCEEDED


async def test_the_end_of_a_run_and_an_interrupted_one(
    opened: tuple[Backend, Backend, JobStore],
) -> None:
    a, b, store = opened
    old = await lead(a, A)
    await store.start(E, A, old, 0)
    await store.finish(E, 1, RunStatus.SUCCEEDED, 0)
    done = await store.read(E)
    assert (done.status, done.exit_code) == (RunStatus.SUCCEEDED, 0)
    assert done.succeeded_at == done.ended_at and done.ended_at is not None
    await store.start(E, A, old, 1)
    await store.interrupt(E, 2, old)  # not below its own term: it may still run
    assert (await store.read(E)).status is RunStatus.RUNNING
    await a.release(Release(E, A, old))
    new = await lead(b, B)
    await store.interrupt(E, 2, new)
    await store.finish(E, 2, RunStatus.FAILED, 1)  # too late: it was recorded interrupted
    last = await store.read(E)
    assert last.status is RunStatus.INTERRUPTED and last.succeeded_at == done.succeeded_at


@pytest.mark.parametrize("url", ADVISORY, indirect=True)
async def test_an_advisory_start_needs_the_lock_held_by_the_holders_session(
    opened: tuple[Backend, Backend, JobStore],
) -> None:
    a, _b, store = opened
    term = await lead(a, A)
    await a.close()  # its lock session ends: the lock is free, the row still names it, unexpired
    assert (await store.start(E, A, term, 0)).runs == 0
