"""/watch: long poll, NDJSON and SSE streams, disconnects and shutdown."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import ClientSession, UnixConnector

from leaderd.api.server import MAX_WATCH_TIMEOUT, build_app, serve
from leaderd.election.engine import Election

from .conftest import eventually


async def leading(node: Any, name: str = "default") -> Election:
    election: Election = node.elections[name]
    await eventually(lambda: election.status().is_leader)
    return election


async def test_watch_answers_at_once_when_revision_differs(api: Any) -> None:
    node, client = await api()
    election = await leading(node)
    revision = election.status().revision
    # Nothing changes: a poll that waited would answer at its timeout, the longest allowed,
    # far past this test's wait.
    poll = client.get(f"/watch?revision={revision - 1}&timeout={MAX_WATCH_TIMEOUT:g}")
    resp = await asyncio.wait_for(poll, 10)
    assert resp.status == 200
    body = await resp.json()
    assert body["revision"] == revision
    assert body["is_leader"] is True
    assert resp.headers["Leaderd-Revision"] == str(revision)


async def test_watch_waits_for_the_next_change(api: Any) -> None:
    node, client = await api()
    election = await leading(node)
    revision = election.status().revision
    # With the current revision, then without any: each waits for the next change.
    steps = [(f"revision={revision}&timeout=30", 60.0, False), ("timeout=30", 0.0, True)]
    for query, cooldown, leads_after in steps:
        poll = asyncio.ensure_future(client.get(f"/watch/default?{query}"))
        await eventually(lambda: election.watchers == 1)
        await asyncio.sleep(0.2)
        assert not poll.done()  # nothing changed yet: still waiting
        election.resign(cooldown)  # 60: step down; 0 (while not leading): campaign again
        resp = await asyncio.wait_for(poll, 5)
        body = await resp.json()
        assert body["revision"] > revision
        assert body["is_leader"] is leads_after
        assert resp.headers["Leaderd-Revision"] == str(body["revision"])
        assert election.watchers == 0
        revision = body["revision"]


async def test_watch_times_out_with_the_same_revision(api: Any) -> None:
    node, client = await api()
    election = await leading(node)
    revision = election.status().revision
    started = time.monotonic()
    resp = await client.get(f"/watch?revision={revision}&timeout=0.3")
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 2
    assert resp.status == 200
    body = await resp.json()
    assert body["revision"] == revision
    assert resp.headers["Leaderd-Revision"] == str(revision)
    assert election.watchers == 0


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("revision=abc", "revision"),
        ("revision=-1", "revision"),
        ("revision=1.5", "revision"),
        ("revision=", "revision"),
        ("revision=99999999999999999999", "revision"),
        ("timeout=-1", "timeout"),
        ("timeout=100000", "timeout"),
        ("timeout=300.5", "timeout"),
        ("timeout=abc", "timeout"),
        ("timeout=nan", "timeout"),
        ("timeout=inf", "timeout"),
        ("stream=maybe", "stream"),
    ],
)
async def test_watch_bad_parameter_400(api: Any, query: str, name: str) -> None:
    node, client = await api()
    resp = await client.get(f"/watch?{query}")
    assert resp.status == 400
    body = await resp.json()
    assert body["error"]["code"] == "bad_parameter"
    assert body["error"]["message"].startswith(name)
    assert node.elections["default"].watchers == 0


async def test_watch_accepts_the_limits(api: Any) -> None:
    node, client = await api()
    election = await leading(node)
    revision = election.status().revision
    resp = await client.get(f"/watch?revision={revision}&timeout=0")
    assert resp.status == 200
    assert (await resp.json())["revision"] == revision
    # timeout=300 is allowed: answered at once since the revision differs.
    resp = await client.get("/watch?revision=0&timeout=300")
    assert resp.status == 200


async def test_ndjson_stream_current_then_change_then_stopped(api: Any) -> None:
    node, client = await api()
    election = await leading(node)
    resp = await client.get("/watch?stream=1")
    assert resp.status == 200
    assert resp.content_type == "application/x-ndjson"
    first = orjson.loads(await resp.content.readline())
    assert first["is_leader"] is True
    assert first["revision"] == election.status().revision
    assert election.watchers == 1
    election.resign(60)
    second = orjson.loads(await asyncio.wait_for(resp.content.readline(), 5))
    assert second["is_leader"] is False
    assert second["revision"] == first["revision"] + 1
    election.stop()
    # The stream ends cleanly after the "stopped" status.
    rest = await asyncio.wait_for(resp.content.read(), 5)
    events = [orjson.loads(line) for line in rest.splitlines()]
    assert events[-1]["role"] == "stopped"
    assert all(e["revision"] > second["revision"] for e in events)
    assert election.watchers == 0


async def read_sse_event(resp: Any) -> dict[str, str]:
    fields: dict[str, str] = {}
    while True:
        line = (await asyncio.wait_for(resp.content.readline(), 5)).decode().rstrip("\n")
        if not line:
            return fields
        key, _, value = line.partition(": ")
        fields[key] = value


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/watch/default", {"Accept": "text/event-stream"}),
        ("/watch?stream=sse", {}),
    ],
)
async def test_sse_stream_current_then_change(api: Any, path: str, headers: dict[str, str]) -> None:
    node, client = await api()
    election = await leading(node)
    resp = await client.get(path, headers=headers)
    assert resp.status == 200
    assert resp.content_type == "text/event-stream"
    first = await read_sse_event(resp)
    assert first["event"] == "status"
    data = json.loads(first["data"])
    assert data["is_leader"] is True
    assert first["id"] == str(data["revision"]) == str(election.status().revision)
    election.resign(60)
    second = await read_sse_event(resp)
    data = json.loads(second["data"])
    assert data["is_leader"] is False
    assert second["id"] == str(data["revision"]) == str(int(first["id"]) + 1)
    resp.close()
    await eventually(lambda: election.watchers == 0)


# ---- the production server (serve() on a Unix socket): disconnects and shutdown ----


async def raw_request(sock_path: Path, target: str, headers: str = "") -> Any:
    reader, writer = await asyncio.open_unix_connection(str(sock_path))
    writer.write(f"GET {target} HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n".encode())
    await writer.drain()
    return reader, writer


@pytest.fixture
async def served(make_node: Any, tmp_path: Path) -> Any:
    node = await make_node()
    path = tmp_path / "leaderd.sock"
    runner = await serve(build_app(node), unix_path=str(path))
    yield node, path, runner
    await runner.cleanup()


@pytest.mark.parametrize(
    "target", ["/watch?timeout=120", "/watch/default?stream=1", "/watch?stream=sse"]
)
async def test_disconnect_leaves_no_watcher(served: Any, target: str) -> None:
    node, path, _ = served
    election = await leading(node)
    clients = [await raw_request(path, target) for _ in range(3)]
    await eventually(lambda: election.watchers == 3)
    for _, writer in clients:
        writer.close()
    await eventually(lambda: election.watchers == 0, timeout=3)
    # The engine still publishes to nobody without trouble, and new watchers work.
    election.resign(0)
    await eventually(lambda: election.status().is_leader)
    assert election.watchers == 0


async def test_shutdown_ends_polls_and_streams(served: Any) -> None:
    node, path, runner = served
    election = await leading(node)
    connector = UnixConnector(path=str(path))
    async with ClientSession(connector=connector) as session:
        poll = asyncio.ensure_future(session.get("http://localhost/watch?timeout=120"))
        stream = await session.get("http://localhost/watch?stream=1")
        first = orjson.loads(await stream.content.readline())
        await eventually(lambda: election.watchers == 2)
        started = time.monotonic()
        await runner.cleanup()
        resp = await asyncio.wait_for(poll, 3)
        assert resp.status == 200
        assert (await resp.json())["revision"] == first["revision"]
        assert await asyncio.wait_for(stream.content.read(), 3) == b""
        assert time.monotonic() - started < 3
    assert election.watchers == 0


async def test_serve_on_a_pre_bound_socket(make_node: Any, tmp_path: Path) -> None:
    import socket

    node = await make_node()
    await leading(node)
    path = tmp_path / "activated.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(128)
    runner = await serve(build_app(node), unix_sock=sock, tcp=("127.0.0.1", 0))
    try:
        async with ClientSession(connector=UnixConnector(path=str(path))) as session:
            resp = await session.get("http://localhost/leader")
            assert resp.status == 200
            assert (await resp.json())["is_leader"] is True
    finally:
        await runner.cleanup()


async def test_serve_needs_a_listener(make_node: Any) -> None:
    node = await make_node(run=False)
    with pytest.raises(ValueError, match="listener"):
        await serve(build_app(node))


@pytest.mark.parametrize(
    ("query", "heartbeat"), [("stream=1", b"\n"), ("stream=sse", b": keep-alive\n\n")]
)
async def test_streams_send_heartbeats_between_changes(
    make_node: Any, aiohttp_client: Any, query: str, heartbeat: bytes
) -> None:
    """Proxies and load balancers cut streams that stay silent: one heartbeat per period."""
    node = await make_node()
    election = await leading(node)
    client = await aiohttp_client(build_app(node, heartbeat=0.1))
    resp = await client.get(f"/watch?{query}")
    first = await resp.content.readuntil(b"\n\n" if query.endswith("sse") else b"\n")
    started = time.monotonic()
    beats = [await resp.content.readexactly(len(heartbeat)) for _ in range(3)]
    assert beats == [heartbeat] * 3
    assert 0.2 < time.monotonic() - started < 2
    election.resign(60)  # a change still arrives as an event, between heartbeats
    line = b""
    while not line.startswith((b"{", b"data: ")):  # past heartbeats, SSE id and event
        line = await resp.content.readline()
    event = line.removeprefix(b"data: ")
    assert orjson.loads(event)["role"] == "follower" and first
    resp.close()
