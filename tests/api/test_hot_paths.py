"""A plain GET /leader or /leader/NAME is answered before aiohttp's router
(leaderd/api/hot_paths.py), exactly as the routed path answers it; every other request on
those paths is routed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from leaderd.api.server import build_app, serve
from leaderd.election.node import Node

from .conftest import MakeNode, eventually


class Routed:
    """Counts the answers that went through the app's router: aiohttp sends the app's
    on_response_prepare signal only for a request its router resolved."""

    def __init__(self) -> None:
        self.count = 0

    async def __call__(self, request: web.Request, response: web.StreamResponse) -> None:
        self.count += 1


@pytest.fixture
async def listening(tmp_path: Path) -> AsyncIterator[Any]:
    runners: list[web.AppRunner] = []

    async def start(node: Node) -> tuple[str, Routed]:
        app, routed = build_app(node), Routed()
        app.on_response_prepare.append(routed)
        path = str(tmp_path / "leaderd.sock")
        runners.append(await serve(app, unix_path=path))
        return path, routed

    yield start
    for runner in runners:
        await runner.cleanup()


async def ask(path: str, *lines: str) -> list[tuple[bytes, bytes]]:
    """Each request line on one keep-alive connection: (head, body) of each answer."""
    reader, writer = await asyncio.open_unix_connection(path)
    answers = []
    for line in lines:
        writer.write(f"{line} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        body = b"" if line.startswith("HEAD") else await reader.readexactly(length)
        answers.append((head, body))
    writer.close()
    return answers


def same_answer(a: tuple[bytes, bytes], b: tuple[bytes, bytes]) -> None:
    """The same status, headers and fields (the lease's time left moves between the two)."""

    def fields(body: bytes) -> dict[str, Any]:
        data = orjson.loads(body)
        data.pop("lease", None)
        return dict(data)

    def headers(head: bytes) -> set[bytes]:
        return {h for h in head.lower().split(b"\r\n") if not h.startswith(b"date:")}

    assert headers(a[0]) == headers(b[0])
    assert fields(a[1]) == fields(b[1])


async def test_a_plain_get_of_leader_skips_the_router_and_answers_as_routed(
    make_node: MakeNode, listening: Any
) -> None:
    node = await make_node()
    await eventually(lambda: node.elections["default"].status().is_leader)
    path, routed = await listening(node)
    hot = await ask(path, "GET /leader", "GET /leader")
    assert routed.count == 0
    assert hot[0][0].startswith(b"HTTP/1.1 200") and b'"is_leader":true' in hot[0][1]
    same_answer(hot[0], (await ask(path, "GET /leader?from=router"))[0])
    assert routed.count == 1


async def test_every_other_request_on_leader_is_routed(make_node: MakeNode, listening: Any) -> None:
    node = await make_node()
    await eventually(lambda: node.elections["default"].status().is_leader)
    path, routed = await listening(node)
    head, options, post, escaped = await ask(
        path, "HEAD /leader", "OPTIONS /leader", "POST /leader", "GET /leader/de%66ault"
    )
    assert routed.count == 4
    assert head[0].startswith(b"HTTP/1.1 200") and head[1] == b""
    assert (
        options[0].startswith(b"HTTP/1.1 200")
        and b"allow: get, head, options" in options[0].lower()
    )
    assert post[0].startswith(b"HTTP/1.1 405")
    same_answer(escaped, (await ask(path, "GET /leader"))[0])


async def test_each_named_election_is_hot_and_the_rest_is_routed(
    make_node: MakeNode, listening: Any
) -> None:
    """Without a default election, /leader is routed: its handler reads the route to say
    which elections there are. An unknown name is routed to its 404."""
    node = await make_node(("a", "b"))
    await eventually(lambda: all(e.status().is_leader for e in node.elections.values()))
    path, routed = await listening(node)
    a, b = await ask(path, "GET /leader/a", "GET /leader/b")
    assert routed.count == 0
    assert b'"election":"a"' in a[1] and b'"election":"b"' in b[1]
    same_answer(a, (await ask(path, "GET /leader/a?from=router"))[0])
    bare, unknown = await ask(path, "GET /leader", "GET /leader/c")
    assert routed.count == 3
    assert bare[0].startswith(b"HTTP/1.1 404") and unknown[0].startswith(b"HTTP/1.1 404")
