"""The OpenAPI document: shipped twice identically, complete, and true (schemathesis)."""

from __future__ import annotations

import asyncio
import importlib.resources
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from leaderd.api.routing import api_routes
from leaderd.api.server import build_app, serve
from leaderd.backends.base import Candidate
from leaderd.backends.static import StaticBackend
from leaderd.election.engine import Election
from leaderd.election.node import Node

from .conftest import FAST, eventually

PACKAGED = importlib.resources.files("leaderd").joinpath("openapi.json").read_bytes()
DOC: dict[str, Any] = json.loads(PACKAGED)
DOCS_COPY = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_docs_copy_is_identical() -> None:
    assert DOCS_COPY.read_bytes() == PACKAGED


async def test_every_served_route_is_documented_and_back(make_node: Any) -> None:
    node = await make_node(run=False)
    served = api_routes(build_app(node))
    documented = {
        (method.upper(), path)
        for path, operations in DOC["paths"].items()
        for method in operations
        if method in ("get", "head", "post", "put", "patch", "delete")
    }
    assert served == documented
    assert ("GET", "/leader/{election}") in served  # the helper sees dynamic routes too


async def test_served_document_is_the_packaged_one(api: Any) -> None:
    _, client = await api(read_only=True)
    resp = await client.get("/openapi.json")
    assert resp.status == 200
    assert resp.content_type == "application/json"
    assert await resp.read() == PACKAGED


def election_status_validator() -> jsonschema.Draft202012Validator:
    schema = {"$ref": "#/components/schemas/ElectionStatus", "components": DOC["components"]}
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


async def test_stream_events_match_the_schema(api: Any) -> None:
    """Streams are outside schemathesis' reach: check each event of a full life here."""
    node, client = await api()
    election = node.elections["default"]
    await eventually(lambda: election.status().is_leader)
    resp = await client.get("/watch?stream=1")
    first = await resp.content.readline()
    election.resign(60)  # leader -> follower
    second = await resp.content.readline()
    election.stop()  # follower -> stopped, then the stream ends
    events = [orjson.loads(line) for line in [first, second, *(await resp.content.read()).split()]]
    assert [e["role"] for e in events] == ["leader", "follower", "stopped"]
    validator = election_status_validator()
    for event in events:
        validator.validate(event)
    broken = dict(events[0], lease={"ttl_ms": 1})  # the validator does catch a bad body
    assert not validator.is_valid(broken)


# ---- schemathesis against a live server on TCP localhost ----


class LiveServer:
    """A node with two elections and its API on 127.0.0.1, in a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self._started = threading.Event()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> LiveServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    async def _start(self) -> None:
        backend = StaticBackend()
        await backend.open(["default", "jobs"])
        candidate = Candidate("node-a", "10.0.0.5:8080")
        self.elections = {n: Election(n, candidate, FAST, backend) for n in ("default", "jobs")}
        self.tasks = [asyncio.create_task(e.run()) for e in self.elections.values()]
        self.runner = await serve(
            build_app(Node("node-a", backend, self.elections)), tcp=("127.0.0.1", 0)
        )
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def _stop(self) -> None:
        await self.runner.cleanup()
        for election in self.elections.values():
            election.stop()
        await asyncio.gather(*self.tasks)


@pytest.fixture(scope="module")
def live_url() -> Iterator[str]:
    with LiveServer() as server:
        yield server.url


schema = schemathesis.openapi.from_dict(DOC)


def keep_short(case: Any) -> None:
    """Long polls answer within 50 ms and streams become long polls, so no call hangs.

    Invalid values stay as generated: they must still be refused with 400."""
    if not case.operation.path.startswith("/watch"):
        return
    query = case.query if case.query is not None else {}
    try:
        raw = query.get("timeout", 30)
        timeout = -1.0 if isinstance(raw, bool) else float(raw)
    except (TypeError, ValueError):
        timeout = -1.0
    if 0 <= timeout <= 300:
        query["timeout"] = min(timeout, 0.05)
    if query.get("stream") in ("1", "true", "ndjson", "sse"):
        query["stream"] = "0"
    case.query = query


@schema.parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
def test_schemathesis(case: Any, live_url: str) -> None:
    keep_short(case)
    response = case.call_and_validate(
        base_url=live_url, excluded_checks=[not_a_server_error], timeout=10
    )
    # No server error other than the 503s the document promises for this operation.
    # (case.method may be one the path does not serve: schemathesis then expects a 405;
    # OPTIONS answers as GET does.)
    method = "get" if case.method.upper() == "OPTIONS" else case.method.lower()
    operation = DOC["paths"][case.operation.path].get(method, {})
    documented = operation.get("responses", {})
    if response.status_code >= 500:
        assert str(response.status_code) in documented, response.text
    if response.headers.get("Content-Type", "").startswith("application/json"):
        orjson.loads(response.content or b"null")
