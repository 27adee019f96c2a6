"""The fault proxy's per-request faults: how it cuts and names requests, and what each fault
does to a real PostgreSQL and a real etcd (applied or not, answered or not)."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.support.chaos.http_requests import HttpRequests
from tests.support.chaos.pg_messages import PgAnswers, PgRequests
from tests.support.chaos.proxy import DELAY, DROP, LATE, LOSE_ANSWER, FaultProxy, Rule
from tests.support.chaos.wire import Link
from tests.support.etcd_cluster import EtcdCluster
from tests.support.etcd_fixtures import etcd, etcd_cluster  # noqa: F401 (fixtures)
from tests.support.pgserver import PgServer


def _link() -> Link:
    return Link(None, None)  # type: ignore[arg-type]  # framers only read its state


def _post(path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def test_http_requests_are_cut_whole_and_named_by_path() -> None:
    link = _link()
    framer = HttpRequests(link)
    stream = (
        _post("/v3/kv/txn", b'{"success":[{"request_put":{}}]}')
        + _post("/v3/lease/keepalive", b'{"ID":"1"}')
        + _post("/v3/kv/txn", b'{"success":[{"request_delete_range":{}}]}')
        + _post("/v3/watch", b"{}")
    )
    units = [u for i in range(0, len(stream), 7) for u in framer.feed(stream[i : i + 7])]
    assert [kind for kind, _ in units] == ["txn", "keepalive", "delete", "watch"]
    assert b"".join(unit for _, unit in units) == stream
    assert link.current == "watch"


def _message(tag: bytes, body: bytes) -> bytes:
    return tag + (len(body) + 4).to_bytes(4, "big") + body


def test_pg_requests_are_grouped_up_to_their_sync_and_named_by_statement() -> None:
    link = _link()
    framer = PgRequests(link)
    ssl = (8).to_bytes(4, "big") + (80877103).to_bytes(4, "big")
    startup = (9).to_bytes(4, "big") + (196608).to_bytes(4, "big") + b"\0"
    parse = _message(b"P", b"s1\0WITH prev AS (SELECT 1) SELECT 1\0\0\0")
    bind = _message(b"B", b"\0s1\0\0\0\0\0\0\0")
    execute, sync = _message(b"E", b"\0\0\0\0\0"), _message(b"S", b"")
    listen = _message(b"Q", b'LISTEN "leaderd"\0')
    stream = ssl + startup + parse + sync + bind + execute + sync + listen
    units = [u for i in range(0, len(stream), 5) for u in framer.feed(stream[i : i + 5])]
    kinds = [kind for kind, _ in units]
    assert kinds == [None, None, "acquire", "acquire", "listen"]
    assert b"".join(unit for _, unit in units) == stream
    assert link.ssl_pending is False  # the startup message came after the server's answer


def test_pg_answers_name_notifications() -> None:
    link = _link()
    link.ssl_pending = True
    ready, notify = _message(b"Z", b"I"), _message(b"A", b"\0\0\0\1chan\0x\0")
    units = PgAnswers(link).feed(b"N" + ready + notify + notify + ready)
    assert [kind for kind, _ in units] == [None, None, "notify", None]


# ---- on real servers ----


@pytest.fixture
async def pg_proxy(pg: PgServer) -> AsyncIterator[tuple[FaultProxy, str]]:
    proxy = await FaultProxy("t", pg.host, pg.port, "pg").start()
    table = f"proxy_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(pg.dsn())
    await conn.execute(f"CREATE TABLE {table} (n int)")
    await conn.close()
    try:
        yield proxy, table
    finally:
        await proxy.close()


async def _insert_through(proxy: FaultProxy, table: str, timeout: float) -> Exception | None:
    """An "acquire" statement through the proxy; the error it met, if any."""
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
    conn = await asyncpg.connect(url, timeout=5)
    try:
        await conn.execute(
            f"WITH prev AS (SELECT 1) INSERT INTO {table} VALUES (1)", timeout=timeout
        )
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
        return exc
    finally:
        conn.terminate()
    return None


async def _rows(pg: PgServer, table: str) -> int:
    conn = await asyncpg.connect(pg.dsn())
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {table}"))
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_a_lost_answer_was_applied_and_a_dropped_request_was_not(
    pg: PgServer, pg_proxy: tuple[FaultProxy, str]
) -> None:
    proxy, table = pg_proxy
    lose = proxy.rules.arm("acquire", Rule(LOSE_ANSWER))
    assert await _insert_through(proxy, table, 5) is not None
    assert lose.fired.is_set() and await _rows(pg, table) == 1
    drop = proxy.rules.arm("acquire", Rule(DROP, 0.2))
    assert await _insert_through(proxy, table, 5) is not None
    assert drop.fired.is_set() and await _rows(pg, table) == 1


@pytest.mark.postgres
async def test_a_late_request_lands_after_its_client_gave_up(
    pg: PgServer, pg_proxy: tuple[FaultProxy, str]
) -> None:
    proxy, table = pg_proxy
    late = proxy.rules.arm("acquire", Rule(LATE, 1.0))
    assert isinstance(await _insert_through(proxy, table, 0.3), TimeoutError)
    assert await _rows(pg, table) == 0
    await late.ended.wait()
    for _ in range(100):
        if await _rows(pg, table):
            break
        await asyncio.sleep(0.02)
    assert await _rows(pg, table) == 1


@pytest.mark.postgres
async def test_a_delay_holds_one_kind_only(pg: PgServer, pg_proxy: tuple[FaultProxy, str]) -> None:
    proxy, table = pg_proxy
    stall = proxy.rules.arm("acquire", Rule(DELAY, float("inf")))
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
    conn = await asyncpg.connect(url, timeout=5)
    try:
        assert await conn.fetchval("SELECT 1", timeout=5) == 1  # a "read" passes
        insert = asyncio.ensure_future(
            conn.execute(f"WITH prev AS (SELECT 1) INSERT INTO {table} VALUES (1)")
        )
        await asyncio.sleep(0.5)
        assert not insert.done() and await _rows(pg, table) == 0
        proxy.rules.end("acquire")
        await asyncio.wait_for(insert, 5)
        assert stall.ended.is_set() and await _rows(pg, table) == 1
    finally:
        conn.terminate()


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def _put_through(port: int, key: str, timeout: float) -> Exception | None:
    body: dict[str, Any] = {"success": [{"request_put": {"key": _b64(key), "value": _b64("v")}}]}
    try:
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}/v3/kv/txn"
            async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(timeout)) as r:
                await r.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return exc
    return None


async def _exists(member: str, key: str) -> bool:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{member}/v3/kv/range", json={"key": _b64(key)}) as r,
    ):
        return bool(json.loads(await r.read()).get("kvs"))


async def test_etcd_requests_lost_dropped_and_late(etcd: EtcdCluster) -> None:  # noqa: F811
    member = etcd.members[0]
    host, port = member.hostport.rsplit(":", 1)
    proxy = await FaultProxy("t", host, int(port), "http").start()
    prefix = f"/proxy-test/{uuid.uuid4().hex[:8]}/"
    try:
        proxy.rules.arm("txn", Rule(LOSE_ANSWER))
        assert await _put_through(proxy.port, prefix + "lost", 5) is not None
        assert await _exists(member.client_url, prefix + "lost")
        proxy.rules.arm("txn", Rule(DROP, 0.2))
        assert await _put_through(proxy.port, prefix + "dropped", 5) is not None
        assert not await _exists(member.client_url, prefix + "dropped")
        late = proxy.rules.arm("txn", Rule(LATE, 1.0))
        assert isinstance(await _put_through(proxy.port, prefix + "late", 0.3), TimeoutError)
        assert not await _exists(member.client_url, prefix + "late")
        await late.ended.wait()
        for _ in range(100):
            if await _exists(member.client_url, prefix + "late"):
                break
            await asyncio.sleep(0.02)
        assert await _exists(member.client_url, prefix + "late")
    finally:
        await proxy.close()
