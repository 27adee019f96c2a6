"""GET /members and GET /history on two nodes sharing a real SQLite file, and the members
metric (docs/api.md, docs/metrics.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from leaderd.api.metrics import Metrics
from leaderd.backends.sqlite.backend import SQLiteBackend

from .conftest import eventually
from .test_metrics import parse, value


async def test_members_history_and_their_metric(api: Any, tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/leaderd.db"
    metrics = Metrics()
    a, client_a = await api(backend=SQLiteBackend.from_url(url), metrics=metrics)
    await eventually(lambda: a.elections["default"].status().is_leader)
    b, client_b = await api(backend=SQLiteBackend.from_url(url), node_id="node-b")
    for node in (a, b):
        await eventually(lambda n=node: n.elections["default"].members().cluster_size == 2)
    for client in (client_a, client_b):
        resp = await client.get("/members")
        body = await resp.json()
        assert resp.status == 200, body
        assert [(m["node_id"], m["role"]) for m in body["members"]] == [
            ("node-a", "leader"),
            ("node-b", "standby"),
        ]
        assert (body["leader"], body["healthy_standbys"], body["cluster_ready"]) == (
            "node-a", 1, True,
        )  # fmt: skip
    samples = parse((await (await client_a.get("/metrics")).read()).decode())
    for state, count in (("leader", 1), ("standby", 1), ("conflict", 0), ("stale", 0)):
        assert value(samples, "leaderd_members", election="default", state=state) == count

    # A resignation hands over; both nodes read the history again and tell it.
    first = a.elections["default"].status().term
    a.elections["default"].resign(10.0)
    await eventually(lambda: b.elections["default"].status().is_leader)
    await eventually(lambda: len(b.elections["default"].history().records) == 2)
    resp = await client_b.get("/history/default?limit=1")
    records = (await resp.json())["records"]
    assert [(r["holder"], r["end_reason"]) for r in records] == [("node-b", None)]
    await eventually(lambda: len(a.elections["default"].history().records) == 2)
    body = await (await client_a.get("/history")).json()
    assert [(r["term"], r["holder"], r["end_reason"]) for r in body["records"]] == [
        (first + 1, "node-b", None),
        (first, "node-a", "resigned"),
    ]
    assert body["retention"] == 100 and body["read_at"] is not None


@pytest.mark.parametrize("limit", ["0", "-1", "101", "1.5", "ten", ""])
async def test_a_bad_limit_is_a_400_json_error(api: Any, limit: str) -> None:
    _, client = await api()
    resp = await client.get(f"/history?limit={limit}")
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "bad_parameter"


async def test_an_unknown_election_is_a_404(api: Any) -> None:
    _, client = await api(["one", "two"])
    for path in ("/members/three", "/history/three", "/members", "/history"):
        resp = await client.get(path)
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "unknown_election"
