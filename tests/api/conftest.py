"""API test set-up: real Elections on real backends (static, SQLite), their loops running."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from leaderd.api.metrics import Metrics
from leaderd.api.server import build_app
from leaderd.backends.base import Backend, Candidate
from leaderd.backends.sqlite.backend import SQLiteBackend
from leaderd.backends.static import StaticBackend
from leaderd.election.engine import Election
from leaderd.election.node import Node
from leaderd.election.timing import Timing

# Short enough that hand-overs happen within a test, long enough to be stable on 2 shared cores.
FAST = Timing(ttl=3.0, renew_interval=0.5, retry_interval=0.2)
ADDRESS = "10.0.0.5:8080"


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The connection tests run on both loops the daemon may use: uvloop's transports are
    not asyncio's (its sockets, its close and EOF handling)."""
    if item.module is not None and item.module.__name__.endswith("test_connections"):
        import uvloop

        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


class MakeNode(Protocol):
    async def __call__(
        self,
        names: Sequence[str] = ("default",),
        *,
        backend: Backend | None = None,
        node_id: str = "node-a",
        run: bool = True,
        metrics: Metrics | None = None,
    ) -> Node: ...


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait until ``check()`` is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s")
        await asyncio.sleep(0.01)


@pytest.fixture
async def make_node() -> AsyncIterator[MakeNode]:
    """Builds Nodes whose election loops run until the test ends."""
    running: list[tuple[Election, asyncio.Task[None]]] = []
    backends: list[Backend] = []

    async def make(
        names: Sequence[str] = ("default",),
        *,
        backend: Backend | None = None,
        node_id: str = "node-a",
        run: bool = True,
        metrics: Metrics | None = None,
    ) -> Node:
        backend = backend or StaticBackend()
        if metrics is not None:
            backend = metrics.wrap(backend)
        if backend not in backends:
            await backend.open(list(names))
            backends.append(backend)
        candidate = Candidate(node_id, ADDRESS)
        elections = {name: Election(name, candidate, FAST, backend) for name in names}
        node = Node(node_id, backend, elections)
        if metrics is not None:
            metrics.watch(node)
        if run:
            for election in elections.values():
                running.append((election, asyncio.create_task(election.run())))
        return node

    yield make
    for election, _ in running:
        election.stop()
    await asyncio.wait_for(asyncio.gather(*(task for _, task in running)), 10)
    for backend in backends:
        await backend.close()


@pytest.fixture
def sqlite_backend(tmp_path: Path) -> SQLiteBackend:
    return SQLiteBackend.from_url(f"sqlite://{tmp_path}/leaderd.db")


ClientFactory = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]


@pytest.fixture
async def api(
    make_node: MakeNode, aiohttp_client: Callable[..., Awaitable[Any]]
) -> Callable[..., Awaitable[tuple[Node, TestClient[web.Request, web.Application]]]]:
    """A running node and a test client on its API."""

    async def start(
        names: Sequence[str] = ("default",), *, read_only: bool = False, **kwargs: Any
    ) -> tuple[Node, TestClient[web.Request, web.Application]]:
        node = await make_node(names, **kwargs)
        metrics = kwargs.get("metrics")
        client = await aiohttp_client(build_app(node, read_only=read_only, metrics=metrics))
        return node, client

    return start
