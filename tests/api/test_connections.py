"""The API's connections under hostile and heavy clients: serve() on real sockets.

Each test reproduces an observed failure: a backlog of 128, slowloris connections held for
minutes, no connection limit, tracebacks for malformed requests, and no answer to clients
that half-close their socket after the request (aiohttp issue 3659).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from leaderd.api.connections import Connections, FileBudget, Limits
from leaderd.api.server import build_app, serve
from leaderd.election.node import Node

from .conftest import MakeNode, eventually


@dataclass
class Served:
    node: Node
    path: str
    port: int
    unix: Connections
    tcp: Connections

    def address(self, family: socket.AddressFamily) -> Any:
        return self.path if family == socket.AF_UNIX else ("127.0.0.1", self.port)


Serve = Callable[..., Awaitable[Served]]


@pytest.fixture
async def served(make_node: MakeNode, tmp_path: Path) -> AsyncIterator[Serve]:
    """serve() on a Unix socket and on TCP localhost, each with its own Connections."""
    runners: list[web.AppRunner] = []

    async def start(limits: Limits | None = None, **app: Any) -> Served:
        limits = limits or Limits()
        node = await make_node()
        await eventually(lambda: node.elections["default"].status().is_leader)
        path = str(tmp_path / "leaderd.sock")
        unix, tcp = Connections("unix", limits), Connections("tcp", limits)
        runners.append(await serve(build_app(node, **app), unix_path=path, connections=unix))
        runner = await serve(build_app(node, **app), tcp=("127.0.0.1", 0), connections=tcp)
        runners.append(runner)
        return Served(node, path, runner.addresses[0][1], unix, tcp)

    yield start
    for runner in runners:
        await runner.cleanup()


FAMILIES = pytest.mark.parametrize("family", [socket.AF_UNIX, socket.AF_INET], ids=["unix", "tcp"])


async def exchange(
    family: socket.AddressFamily, address: Any, data: bytes, *, half_close: bool = True
) -> bytes:
    """Send ``data`` on a raw socket, shut down the write side, read until the server
    closes: what `printf ... | socat -` and `nc -N` do."""

    def run() -> bytes:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(address)
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)

    return await asyncio.to_thread(run)


def status_code(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1."), answer[:100]
    return int(answer.split(b" ", 2)[1])


def body(answer: bytes) -> Any:
    return orjson.loads(answer.split(b"\r\n\r\n", 1)[1])


# ---- half-closing clients get their answer ----


@FAMILIES
@pytest.mark.parametrize("version", ["1.0", "1.1"])
async def test_half_closed_client_gets_its_answer(
    served: Serve, family: socket.AddressFamily, version: str
) -> None:
    s = await served()
    request = f"GET /leader HTTP/{version}\r\nHost: x\r\n\r\n".encode()
    for _ in range(20):  # before the fix most of these got no answer at all
        answer = await exchange(family, s.address(family), request)
        assert status_code(answer) == 200
        assert body(answer)["is_leader"] is True


@FAMILIES
async def test_half_closed_long_poll_gets_its_answer(
    served: Serve, family: socket.AddressFamily
) -> None:
    s = await served()
    request = b"GET /watch?timeout=0.3 HTTP/1.0\r\n\r\n"
    answer = await exchange(family, s.address(family), request)
    assert status_code(answer) == 200 and body(answer)["role"] == "leader"


@pytest.mark.skipif(not shutil.which("socat"), reason="socat: run .ci/install-deps.sh")
@FAMILIES
async def test_socat_pipe_gets_its_answer(served: Serve, family: socket.AddressFamily) -> None:
    s = await served()
    target = f"UNIX-CONNECT:{s.path}" if family == socket.AF_UNIX else f"TCP:127.0.0.1:{s.port}"
    for _ in range(10):
        done = await asyncio.to_thread(
            subprocess.run,
            ["socat", "-t", "5", "-", target],
            input=b"GET /leader HTTP/1.0\r\n\r\n",
            capture_output=True,
            timeout=10,
        )
        assert status_code(done.stdout) == 200, done


async def test_closed_unix_client_ends_its_watch_at_once(served: Serve) -> None:
    """A full close is told apart from a half-close on a Unix socket (the handler is
    cancelled, as it must be on aiohttp 3.8 too, where it leaked)."""
    s = await served()
    election = s.node.elections["default"]
    socks = []
    for target in ("/watch?timeout=120", "/watch?stream=1"):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(s.path)
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        socks.append(sock)
    await eventually(lambda: election.watchers == 2)
    for sock in socks:
        sock.close()
    await eventually(lambda: election.watchers == 0, timeout=2)


@FAMILIES
async def test_stream_closed_before_its_first_event_ends_quietly(
    served: Serve, family: socket.AddressFamily, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that sends a stream request and closes at once is gone before the first
    event is written: the stream ends with no traceback (CI saw 20 on aiohttp 3.8)."""
    s = await served()
    election = s.node.elections["default"]
    caplog.set_level(logging.DEBUG)
    for _ in range(20):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.connect(s.address(family))
            sock.sendall(b"GET /watch?stream=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.sleep(0.2)
    await eventually(lambda: election.watchers == 0, timeout=2)
    assert not [r.getMessage() for r in caplog.records if r.exc_info]


# ---- bounds: backlog, header and idle timeouts, connection limit ----


async def test_backlog_holds_600_clients_connecting_at_once(served: Serve) -> None:
    """The event loop does not run while this test connects: every client waits in the
    listen backlog. With aiohttp's 128 the rest got EAGAIN ("daemon unreachable")."""
    s = await served()
    socks, refused = [], 0
    for _ in range(600):
        sock = socket.socket(socket.AF_UNIX)
        sock.setblocking(False)
        code = sock.connect_ex(s.path)
        if code == 0:
            socks.append(sock)
        else:
            assert code == errno.EAGAIN, errno.errorcode[code]
            refused += 1
            sock.close()
    assert refused == 0
    for sock in socks:
        sock.setblocking(True)
        sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
    answers = await asyncio.gather(*(asyncio.to_thread(read_all, sock) for sock in socks))
    assert all(status_code(a) == 200 for a in answers)


def read_all(sock: socket.socket) -> bytes:
    with sock:
        sock.settimeout(10)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


FAST = Limits(max_connections=100, header_timeout=0.3, keepalive_timeout=0.5)


@FAMILIES
async def test_slow_headers_are_cut_after_header_timeout(
    served: Serve, family: socket.AddressFamily
) -> None:
    s = await served(FAST)
    counts = s.unix if family == socket.AF_UNIX else s.tcp
    started = time.monotonic()
    slow, silent = (
        exchange(family, s.address(family), b"GET /leader HTTP/1.1\r\nHost", half_close=False),
        exchange(family, s.address(family), b"", half_close=False),
    )
    answers = await asyncio.gather(slow, silent)
    assert time.monotonic() - started < 2
    assert status_code(answers[0]) == 408 and answers[1] == b""
    assert counts.timed_out == {"header": 2, "idle": 0}
    assert counts.open == 0


async def test_idle_keepalive_is_closed_but_long_polls_and_streams_are_not(
    served: Serve,
) -> None:
    s = await served(FAST)
    election = s.node.elections["default"]
    reader, writer = await asyncio.open_unix_connection(s.path)
    # The idle deadline is armed once the answer is made, after this: whatever the load,
    # the close comes at least keepalive_timeout after it (and the idle sweep makes it).
    asked = time.monotonic()
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    await reader.read()  # headers, body, then the close at keepalive_timeout
    assert time.monotonic() - asked >= FAST.keepalive_timeout
    assert s.unix.timed_out == {"header": 0, "idle": 1}
    # Longer than both timeouts, yet answered: a request in progress is never idle.
    poll = exchange(
        socket.AF_UNIX, s.path, b"GET /watch?timeout=1.5 HTTP/1.0\r\n\r\n", half_close=False
    )
    _, stream_writer = await asyncio.open_unix_connection(s.path)
    stream_writer.write(b"GET /watch?stream=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_code(await poll) == 200
    await eventually(lambda: election.watchers == 1)
    stream_writer.close()
    assert s.unix.timed_out == {"header": 0, "idle": 1}


async def test_connections_over_the_limit_get_503_and_are_counted(served: Serve) -> None:
    s = await served(Limits(max_connections=3, header_timeout=5, keepalive_timeout=5))
    election = s.node.elections["default"]
    held = []
    for _ in range(3):
        _, writer = await asyncio.open_unix_connection(s.path)
        writer.write(b"GET /watch?timeout=60 HTTP/1.1\r\nHost: x\r\n\r\n")
        held.append(writer)
    await eventually(lambda: election.watchers == 3)
    for _ in range(2):
        answer = await exchange(
            socket.AF_UNIX, s.path, b"GET /leader HTTP/1.1\r\nHost: x\r\n\r\n", half_close=False
        )
        assert status_code(answer) == 503
        assert b"Retry-After: 1\r\n" in answer
        error = body(answer)["error"]
        assert error["code"] == "too_many_connections"
        assert "at most 3 connections" in error["message"]
    assert s.unix.rejected == {"max_connections": 2, "open_files": 0}
    assert s.unix.open == 3
    held.pop().close()
    await eventually(lambda: s.unix.open == 2)
    answer = await exchange(socket.AF_UNIX, s.path, b"GET /leader HTTP/1.0\r\n\r\n")
    assert status_code(answer) == 200
    for writer in held:
        writer.close()


def test_file_budget_keeps_room_for_the_daemon() -> None:
    assert FileBudget(65536).capacity >= 16384  # the unit's LimitNOFILE: 10,000 watchers fit
    assert FileBudget(20000).capacity >= 10002
    small = FileBudget(256)
    assert 0 < small.capacity <= 256 - 64 - small.backlog


async def test_connections_over_the_open_file_budget_get_503(
    make_node: MakeNode, tmp_path: Path
) -> None:
    node = await make_node()
    budget = FileBudget(256)
    budget.open = budget.capacity  # as if the other listener held them all
    connections = Connections("unix", Limits(), budget)
    path = str(tmp_path / "s.sock")
    runner = await serve(build_app(node), unix_path=path, connections=connections)
    try:
        answer = await exchange(socket.AF_UNIX, path, b"GET /leader HTTP/1.0\r\n\r\n")
        assert status_code(answer) == 503
        assert "short of open files" in body(answer)["error"]["message"]
        assert connections.rejected["open_files"] == 1
    finally:
        await runner.cleanup()


# ---- malformed requests ----


BAD = [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # TLS on a plain port
    b"GET /leader HTTP/9.9\r\n\r\n",
    b"GET /leader HTTP/1.1\r\nBad Header\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
    b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
    b"BREW /leader HTCPCP/1.0\r\n\r\n",
]


@FAMILIES
async def test_malformed_requests_log_one_line_now_and_then(
    served: Serve, family: socket.AddressFamily, caplog: pytest.LogCaptureFixture
) -> None:
    s = await served()
    counts = s.unix if family == socket.AF_UNIX else s.tcp
    caplog.set_level(logging.DEBUG)
    for i in range(41):
        answer = await exchange(family, s.address(family), BAD[i % len(BAD)])
        assert answer == b"" or status_code(answer) == 400
    assert counts.bad_requests >= 35  # a TLS hello may be dropped before it is a request
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in caplog.records if r.exc_info], "no traceback for a bad request"
    assert len(records) == 1, [r.getMessage() for r in records]
    assert records[0].getMessage().startswith(f"bad request on the {counts.listener} listener")
    assert "\n" not in records[0].getMessage()


async def test_connection_metrics(served: Serve) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from leaderd.api.metrics import Metrics

    s = await served(Limits(max_connections=1, header_timeout=0.2, keepalive_timeout=5))
    metrics = Metrics()
    metrics.watch_connections(s.unix)

    def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        families = text_string_to_metric_families(metrics.exposition().decode())
        return {
            (x.name, tuple(sorted(x.labels.items()))): x.value
            for f in families
            if f.name.startswith("leaderd_http")
            for x in f.samples
        }

    zero = samples()  # every series exists from the start, so increase() sees the first one
    assert zero[("leaderd_http_connections", (("listener", "unix"),))] == 0
    for reason in ("max_connections", "open_files"):
        key = (("listener", "unix"), ("reason", reason))
        assert zero[("leaderd_http_connections_rejected_total", key)] == 0
    for timeout in ("header", "idle"):
        key = (("listener", "unix"), ("timeout", timeout))
        assert zero[("leaderd_http_connections_timed_out_total", key)] == 0
    assert zero[("leaderd_http_bad_requests_total", (("listener", "unix"),))] == 0
    silent = socket.socket(socket.AF_UNIX)
    silent.connect(s.path)
    await eventually(lambda: s.unix.open == 1)
    assert samples()[("leaderd_http_connections", (("listener", "unix"),))] == 1
    refused = await exchange(socket.AF_UNIX, s.path, b"GET /health HTTP/1.0\r\n\r\n")
    assert status_code(refused) == 503
    await eventually(lambda: s.unix.open == 0)  # the silent one timed out
    silent.close()
    after = samples()
    rejected = (("listener", "unix"), ("reason", "max_connections"))
    assert after[("leaderd_http_connections_rejected_total", rejected)] == 1
    header = (("listener", "unix"), ("timeout", "header"))
    assert after[("leaderd_http_connections_timed_out_total", header)] == 1


async def test_abandoned_tcp_stream_ends_at_a_heartbeat(served: Serve) -> None:
    """On TCP a closed client looks half-closed: the heartbeat's failed write ends it."""
    s = await served(heartbeat=0.1)
    election = s.node.elections["default"]
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"GET /watch?stream=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    await eventually(lambda: election.watchers == 1)
    sock.close()
    await eventually(lambda: election.watchers == 0, timeout=3)
    await eventually(lambda: s.tcp.open == 0)
