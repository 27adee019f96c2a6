"""Queries per second per node at steady state with the default timing (ttl 15, renew 5,
retry 2), three nodes, an engine-like loop.

The loop runs that timing SCALE times faster: the same requests per renewal, in a quarter of
the time (about 5 s per backend). The rates are given in the default timing's seconds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest

from leaderd.backends import Backend, BackendError, Candidate
from tests.backends.postgres.helpers import opened, unique
from tests.support.backend_calls import ask
from tests.support.pgserver import PgServer

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

SCALE = 4.0
TTL, RENEW, RETRY = 15.0 / SCALE, 5.0 / SCALE, 2.0 / SCALE
WARMUP, WINDOW = 2.0 / SCALE, 18.0 / SCALE


async def node(backend: Backend, me: Candidate, e: str, stop: asyncio.Event) -> None:
    """The engine's loop, reduced to its requests."""
    while not stop.is_set():
        t_send = time.monotonic()
        try:
            lease = await ask(backend, e, me, TTL, timeout=TTL - RENEW, wait=RENEW)
        except BackendError:
            await asyncio.sleep(RETRY)
            continue
        if lease.held_by(me):
            await asyncio.sleep(max(0.0, t_send + RENEW - time.monotonic()))
        else:
            period = min(RENEW, lease.expires_in if lease.expires_in is not None else RENEW)
            await backend.wait_for_change(e, max(0.0, t_send + period - time.monotonic()))


async def test_steady_state_queries_per_node(
    pg_server: PgServer, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts: dict[str, int] = {}
    connect = asyncpg.connect

    async def counting_connect(*args: Any, **kwargs: Any) -> Any:
        conn = await connect(*args, **kwargs)
        name = kwargs["server_settings"]["application_name"]
        conn.add_query_logger(lambda record: counts.__setitem__(name, counts.get(name, 0) + 1))
        return conn

    monkeypatch.setattr(asyncpg, "connect", counting_connect)
    e, table = unique(), unique("t")
    stop = asyncio.Event()
    async with (
        opened(pg_server.dsn(scheme=scheme, table=table, application_name="n0"), e) as b0,
        opened(pg_server.dsn(scheme=scheme, table=table, application_name="n1"), e) as b1,
        opened(pg_server.dsn(scheme=scheme, table=table, application_name="n2"), e) as b2,
    ):
        tasks = [
            asyncio.create_task(node(b, Candidate(f"n{i}"), e, stop))
            for i, b in enumerate((b0, b1, b2))
        ]
        await asyncio.sleep(WARMUP)
        before = dict(counts)
        await asyncio.sleep(WINDOW)
        after = dict(counts)
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    # Per second of the default timing: the window stands for SCALE times as long.
    qps = {n: (after.get(n, 0) - before.get(n, 0)) / (WINDOW * SCALE) for n in ("n0", "n1", "n2")}
    print(
        f"\n{scheme}: steady-state queries/s per node: "
        + ", ".join(f"{n} {q:.2f}" for n, q in sorted(qps.items()))
    )
    assert all(q <= 1.0 for q in qps.values()), qps
