"""The node's own endpoints of docs/api.md: /ready, /health, /status and /standby."""

from __future__ import annotations

from typing import Any

from leaderd import __version__
from leaderd.api.server import build_app
from leaderd.backends import redact_url
from leaderd.backends.sqlite.backend import SQLiteBackend
from leaderd.backends.static import StaticBackend
from leaderd.clock import SystemClock
from leaderd.election.engine import Election
from leaderd.election.node import Node

from .conftest import ADDRESS, FAST, eventually
from .status_fields import STATUS_FIELDS, check_leader_status, parse_time


async def test_ready_503_before_first_round_then_200(make_node: Any, aiohttp_client: Any) -> None:
    from leaderd.api.server import build_app

    node = await make_node(["default", "other"], run=False)
    client = await aiohttp_client(build_app(node))
    resp = await client.get("/ready")
    assert resp.status == 503
    body = await resp.json()
    assert body["error"]["code"] == "not_ready"
    assert "default" in body["error"]["message"] and "other" in body["error"]["message"]
    await node.elections["default"].round()
    resp = await client.get("/ready")
    assert resp.status == 503
    assert "other" in (await resp.json())["error"]["message"]
    await node.elections["other"].round()
    resp = await client.get("/ready")
    assert resp.status == 200
    assert await resp.json() == {"status": "ready"}
    # Readiness never depends on leadership.
    node.elections["default"].resign(60)
    assert (await client.get("/ready")).status == 200


class StepClock(SystemClock):
    """The system clock, plus a jump we control (a process pause, seen from inside)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return super().now() + self.offset


async def test_health_200_then_503_when_the_loop_stalls(aiohttp_client: Any) -> None:
    from leaderd.api.server import build_app

    backend = StaticBackend()
    await backend.open(["default"])
    clock = StepClock()
    from leaderd.backends.base import Candidate

    election = Election("default", Candidate("node-a", ADDRESS), FAST, backend, clock=clock)
    node = Node("node-a", backend, {"default": election})
    client = await aiohttp_client(build_app(node))
    await election.round()  # the loop is due again within a few seconds
    resp = await client.get("/health")
    assert resp.status == 200
    assert await resp.json() == {"status": "ok"}
    clock.offset = 100.0  # the loop did not turn for 100 s
    resp = await client.get("/health")
    assert resp.status == 503
    body = await resp.json()
    assert body["error"]["code"] == "unhealthy"
    assert "stalled" in body["error"]["message"]


async def test_health_200_on_running_node(api: Any) -> None:
    node, client = await api()
    await eventually(lambda: node.ready)
    resp = await client.get("/health")
    assert resp.status == 200


class FakePostgres(StaticBackend):
    """Stands in for a PostgreSQL backend: only its URL matters to /status."""

    kind = "postgresql"
    URL = "postgresql://leaderd:hunter2secret@db.internal:5432/leaderd?password=hunter2secret"

    @property
    def description(self) -> str:
        return redact_url(self.URL)


async def test_status_fields_and_no_password(api: Any) -> None:
    node, client = await api(["default", "jobs"], backend=FakePostgres())
    await eventually(lambda: node.ready and node.elections["jobs"].status().is_leader)
    resp = await client.get("/status")
    assert resp.status == 200
    text = await resp.text()
    assert "hunter2secret" not in text
    body = await resp.json()
    assert set(body) == {
        "node_id",
        "version",
        "uptime_s",
        "started_at",
        "ready",
        "health",
        "backend",
        "elections",
        "checks",
    }
    assert body["node_id"] == "node-a"
    assert body["version"] == __version__
    assert body["uptime_s"] >= 0
    assert body["ready"] is True
    assert body["health"] == "ok"
    assert body["backend"]["kind"] == "postgresql"
    assert body["backend"]["url"].startswith("postgresql://leaderd:***@db.internal:5432/leaderd")
    parse_time(body["backend"]["last_contact"])
    assert body["backend"]["last_error"] is None
    assert set(body["elections"]) == {"default", "jobs"}
    check_leader_status(body["elections"]["jobs"], "jobs")


async def test_standby_200_only_for_a_healthy_follower_that_knows_the_leader(
    api: Any,
    make_node: Any,
    aiohttp_client: Any,
    sqlite_backend: SQLiteBackend,
    tmp_path: Any,
    monkeypatch: Any,
) -> None:
    leader = await make_node(backend=sqlite_backend, node_id="node-a")
    await eventually(lambda: leader.elections["default"].status().is_leader)
    leader_client = await aiohttp_client(build_app(leader))
    other = SQLiteBackend.from_url(f"sqlite://{tmp_path}/leaderd.db")
    node, client = await api(backend=other, node_id="node-b")
    await eventually(lambda: node.elections["default"].status().role.value == "follower")
    for path in ("/standby", "/standby/default"):
        resp = await client.get(path)
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        assert set(body) == STATUS_FIELDS and body["leader"]["node_id"] == "node-a"
        assert resp.headers["Leaderd-Revision"] == str(body["revision"])
        assert (await client.head(path)).status == 200
    # The leader is no standby; neither is an unhealthy follower, nor an unknown election.
    assert (await leader_client.get("/standby")).status == 503
    monkeypatch.setattr(node, "health", lambda: "election default: loop stalled")
    assert (await client.get("/standby")).status == 503
    assert (await client.get("/standby/nope")).status == 404


# Every GET route (see test_openapi for the list being complete), some with a bad query.
