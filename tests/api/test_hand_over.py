"""POST /resign?to=NODE (docs/api.md): hand over to a chosen standby, on real SQLite daemons."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from leaderd.backends.sqlite.backend import SQLiteBackend
from leaderd.election.node import Node

from .conftest import eventually


def leaders(*nodes: Node) -> list[str]:
    return [n.node_id for n in nodes if n.elections["default"].status().is_leader]


async def three(api: Any, make_node: Any, tmp_path: Path) -> tuple[Node, Any, Node, Node]:
    """node-a (with an API client) leads; node-b and node-c follow on the same file."""
    url = f"sqlite://{tmp_path}/leaderd.db"
    a, client = await api(backend=SQLiteBackend.from_url(url), node_id="node-a")
    await eventually(lambda: a.elections["default"].status().is_leader)
    b = await make_node(backend=SQLiteBackend.from_url(url), node_id="node-b")
    c = await make_node(backend=SQLiteBackend.from_url(url), node_id="node-c")
    for n in (b, c):
        await eventually(lambda n=n: n.elections["default"].status().leader is not None)
    # resign?to= names live standbys only: wait until node-a's renewals list both.
    roster = a.elections["default"].members
    await eventually(lambda: roster().standby_ids() == ["node-b", "node-c"])
    return a, client, b, c


async def test_resign_to_hands_over_to_the_named_standby_only(
    api: Any, make_node: Any, tmp_path: Path
) -> None:
    a, client, b, c = await three(api, make_node, tmp_path)
    term = a.elections["default"].status().term
    resp = await client.post("/resign?to=node-c&cooldown=0")
    assert resp.status == 200
    assert (await resp.json())["is_leader"] is False
    seen: set[str] = set()
    for _ in range(200):  # two seconds: node-b never leads, node-c leads at once
        now = leaders(a, b, c)
        assert len(now) <= 1, now
        seen.update(now)
        await asyncio.sleep(0.01)
    assert seen == {"node-c"}
    assert c.elections["default"].status().term == term + 1


@pytest.mark.parametrize("to", ["", "a%20b", "x" * 254, "node-a"])
async def test_a_bad_to_is_400_and_changes_nothing(
    api: Any, make_node: Any, tmp_path: Path, to: str
) -> None:
    a, client, _, _ = await three(api, make_node, tmp_path)
    resp = await client.post(f"/resign?to={to}")
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["code"] == "bad_parameter" and "to " in error["message"]
    assert a.elections["default"].status().is_leader


async def test_resign_to_a_node_that_is_no_live_standby_is_409_and_changes_nothing(
    api: Any, make_node: Any, tmp_path: Path
) -> None:
    a, client, _, _ = await three(api, make_node, tmp_path)
    resp = await client.post("/resign?to=node-cc")  # a typo: nobody would take the lease
    assert resp.status == 409
    error = (await resp.json())["error"]
    assert error["code"] == "not_a_standby"
    assert "has stopped or is not a member" in error["message"]
    assert "live standbys: node-b, node-c)" in error["message"]
    assert a.elections["default"].status().is_leader
    assert a.elections["default"].state.epoch == 0  # a refused request does not resign


async def test_resign_to_on_a_follower_is_409_not_leader(
    api: Any, make_node: Any, tmp_path: Path
) -> None:
    url = f"sqlite://{tmp_path}/leaderd.db"
    a = await make_node(backend=SQLiteBackend.from_url(url), node_id="node-a")
    await eventually(lambda: a.elections["default"].status().is_leader)
    b, client = await api(backend=SQLiteBackend.from_url(url), node_id="node-b")
    await eventually(lambda: b.elections["default"].status().leader is not None)
    resp = await client.post("/resign?to=node-c")
    assert resp.status == 409
    error = (await resp.json())["error"]
    assert error["code"] == "not_leader" and "(leader: node-a)" in error["message"]
    assert a.elections["default"].status().is_leader
    assert b.elections["default"].state.epoch == 0  # a refused request does not resign


async def test_plain_resign_on_a_follower_is_409_unless_a_cooldown_is_given(
    api: Any, make_node: Any, tmp_path: Path
) -> None:
    """Nothing to resign: the follower's cooldown is left alone; an explicit cooldown keeps
    it out of the election for that long (maintenance)."""
    url = f"sqlite://{tmp_path}/leaderd.db"
    a = await make_node(backend=SQLiteBackend.from_url(url), node_id="node-a")
    await eventually(lambda: a.elections["default"].status().is_leader)
    b, client = await api(backend=SQLiteBackend.from_url(url), node_id="node-b")
    await eventually(lambda: b.elections["default"].status().leader is not None)
    resp = await client.post("/resign")
    assert resp.status == 409
    error = (await resp.json())["error"]
    assert error["code"] == "not_leader" and error["message"].endswith(": nothing to resign")
    assert b.elections["default"].state.epoch == 0
    resp = await client.post("/resign?cooldown=60")
    assert resp.status == 200
    assert b.elections["default"].state.epoch == 1


async def test_resign_to_on_static_is_409_no_standby(api: Any) -> None:
    node, client = await api()  # static://
    await eventually(lambda: node.elections["default"].status().is_leader)
    for _ in range(2):  # each refusal is a new answer (a cached one was never sent twice)
        resp = await client.post("/resign?to=node-b")
        assert resp.status == 409
        assert (await resp.json())["error"]["code"] == "no_standby"
    assert node.elections["default"].status().is_leader


async def test_resign_to_is_404_for_an_unknown_election_and_403_read_only(api: Any) -> None:
    node, client = await api()
    await eventually(lambda: node.elections["default"].status().is_leader)
    assert (await client.post("/resign/nope?to=node-b")).status == 404
    _, read_only = await api(read_only=True)
    resp = await read_only.post("/resign?to=node-b")
    assert resp.status == 403 and (await resp.json())["error"]["code"] == "read_only"
