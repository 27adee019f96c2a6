"""The job record stores (backends/jobs.py) on a real SQLite file and the suite's real
PostgreSQL: a start is recorded only by the lease's holder with its term, unexpired, and
only on the record as read (at most one start follows any record)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from leaderd.backends import Backend, Candidate, backend_from_url
from leaderd.backends.asks import Ask, Release
from leaderd.backends.jobs import JobStore, RunStatus, job_store_from_url
from tests.support.pgserver import PgServer

E = "default"
A, B = Candidate("node-a"), Candidate("node-b")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/lease.db"
    pg: PgServer = request.getfixturevalue("pg_server")
    return pg.dsn(table=f"jobs_{uuid.uuid4().hex[:8]}")


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


async def test_a_lapsed_lease_records_no_start(opened: tuple[Backend, Backend, JobStore]) -> None:
    a, _b, store = opened
    term = await lead(a, A, ttl=0.5)
    await asyncio.sleep(0.7)
    assert (await store.start(E, A, term, 0)).runs == 0


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
