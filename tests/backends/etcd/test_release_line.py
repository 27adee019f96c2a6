"""The release's own connection (leaderd/backends/etcd/line.py): a release is written on a
connection opened before it was needed; one the line cannot deliver in its half of the time
goes through the client, and a copy of the line's that lands after the client's changes
nothing. On the real 3-member cluster, the line's request held or delayed by a proxy; and
the line's reading of HTTP/1.1 answers, on the bytes a member sends."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from leaderd.backends import Backend, Candidate, backend_from_url
from leaderd.backends.etcd.backend import EtcdBackend
from leaderd.backends.etcd.line import response
from leaderd.clock import boottime
from tests.backends.etcd.gateway_proxy import HOLD, PASS, GatewayProxy
from tests.support.backend_calls import ask, release
from tests.support.etcd_cluster import EtcdCluster
from tests.support.grants import stand_with_a_spare, wait_grant

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
E = "default"
TTL = 8.0  # B's spare outlives the test's waits without rounds of B's
TXN = "/v3/kv/txn"


async def _open(url: str, opened: list[Backend]) -> EtcdBackend:
    backend = backend_from_url(url)
    assert isinstance(backend, EtcdBackend)
    opened.append(backend)
    await backend.open([E])
    return backend


async def _leader_and_heir(
    leader_url: str, etcd: EtcdCluster, prefix: str, opened: list[Backend]
) -> tuple[EtcdBackend, EtcdBackend, int]:
    """A leads (through ``leader_url``) with its line open and B's offer read; B stands."""
    a = await _open(leader_url, opened)
    b = await _open(etcd.url(prefix=prefix), opened)
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await stand_with_a_spare(b, E, B, TTL)
    await ask(a, E, A, ttl=TTL, timeout=5)  # the renewal reads the offer
    async with asyncio.timeout(3):
        while not a.line.open:  # noqa: ASYNC110 - it opens in the background
            await asyncio.sleep(0.01)
    return a, b, held.term


async def _released_to_b(
    a: EtcdBackend, b: EtcdBackend, term: int, etcd: EtcdCluster, prefix: str
) -> tuple[str, int, int]:
    """A's release grants B term + 1: the leader key as B holds it."""
    await release(a, E, A, term, grant=True)
    assert (await wait_grant(b, E)).lease.term == term + 1
    granted = _holder(etcd, prefix)
    assert granted[:2] == (B.node_id, term + 1)
    return granted


def _proxied(proxy: GatewayProxy, prefix: str) -> str:
    return f"etcd://127.0.0.1:{proxy.port}/?prefix={prefix}"


def _holder(etcd: EtcdCluster, prefix: str) -> tuple[str, int, int]:
    value, kv = etcd.get(f"{prefix}{E}/leader")
    assert value is not None
    record = json.loads(value)
    return record["node_id"], int(record["term"]), int(kv["mod_revision"])


@pytest.fixture
def prefix() -> str:
    return f"/leaderd-test/{uuid.uuid4().hex[:10]}/"


async def test_a_release_is_written_on_the_line(
    etcd: EtcdCluster, prefix: str, opened: list[Backend]
) -> None:
    a, b, term = await _leader_and_heir(etcd.url(prefix=prefix), etcd, prefix, opened)
    await _released_to_b(a, b, term, etcd, prefix)
    assert a.line.answered == 1


async def test_a_release_the_line_cannot_deliver_goes_through_the_client(
    etcd: EtcdCluster, proxy: GatewayProxy, prefix: str, opened: list[Backend]
) -> None:
    a, b, term = await _leader_and_heir(_proxied(proxy, prefix), etcd, prefix, opened)
    proxy.fault_next(HOLD, TXN)  # the line's copy never reaches etcd
    since = boottime()
    await _released_to_b(a, b, term, etcd, prefix)
    assert [s.fault for s in proxy.requests(TXN, since=since)] == [HOLD, PASS]
    assert a.line.answered == 0 and not a.line.open  # a line that gave up is not reused


async def test_the_lines_copy_that_lands_after_the_clients_changes_nothing(
    etcd: EtcdCluster, proxy: GatewayProxy, prefix: str, opened: list[Backend]
) -> None:
    a, b, term = await _leader_and_heir(_proxied(proxy, prefix), etcd, prefix, opened)
    proxy.fault_next(PASS, TXN, late=3.5)  # after the line's 2.5 s and the client's copy
    granted = await _released_to_b(a, b, term, etcd, prefix)
    await asyncio.sleep(1.0)
    await ask(b, E, B, ttl=TTL, timeout=5)  # B leads on: its lease is kept alive
    await asyncio.sleep(1.0)  # the late copy has landed meanwhile; its compare failed
    assert [s.fault for s in proxy.requests(TXN)][-2:] == [PASS, PASS]
    assert _holder(etcd, prefix) == granted  # not even rewritten: the same mod revision


@pytest.mark.parametrize(
    "pieces",
    [
        [b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n", b'{"a":"b"}\r\n'],
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":", b"\r\n6\r\n",
         b"\"b\"}\r\n\r\n0\r\n", b"\r\n"],
        [b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\nb;x=1\r\n{\"a\":\"b\"}\r\n\r\n",
         b"0\r\nGrpc-Trailer: 0\r\n\r\n"],
    ],
    ids=["length", "chunks", "trailers"],
)  # fmt: skip
def test_an_answer_is_complete_only_with_its_last_byte(pieces: list[bytes]) -> None:
    data = b"".join(pieces)
    for cut in range(len(data)):
        assert response(data[:cut]) is None, cut
    assert response(data) == (200, b'{"a":"b"}\r\n', True)


def test_an_answer_that_closes_or_is_garbled() -> None:
    closing = b"HTTP/1.1 503 Unavailable\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    assert response(closing) == (503, b"{}", False)
    for garbled in (
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
    ):
        with pytest.raises(ValueError):
            response(garbled)  # fmt: skip
