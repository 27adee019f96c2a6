"""The election endpoints of docs/api.md against real elections: /leader, /resign, the
errors, and HEAD and OPTIONS (the node's own: test_node_endpoints.py)."""

from __future__ import annotations

from typing import Any

import pytest

from leaderd.backends.sqlite.backend import SQLiteBackend

from .conftest import ADDRESS, eventually
from .status_fields import STATUS_FIELDS, check_leader_status


async def test_leader_200_with_every_field(api: Any) -> None:
    node, client = await api()
    await eventually(lambda: node.elections["default"].status().is_leader)
    for path in ("/leader", "/leader/default"):
        resp = await client.get(path)
        assert resp.status == 200
        assert resp.content_type == "application/json"
        body = await resp.json()
        check_leader_status(body, "default")
        assert resp.headers["Leaderd-Revision"] == str(body["revision"])


async def test_leader_503_for_follower_on_shared_sqlite(
    api: Any, make_node: Any, sqlite_backend: SQLiteBackend, tmp_path: Any
) -> None:
    leader = await make_node(backend=sqlite_backend, node_id="node-a")
    await eventually(lambda: leader.elections["default"].status().is_leader)
    other = SQLiteBackend.from_url(f"sqlite://{tmp_path}/leaderd.db")
    node, client = await api(backend=other, node_id="node-b")
    await eventually(lambda: node.elections["default"].status().role.value == "follower")
    resp = await client.get("/leader")
    assert resp.status == 503
    body = await resp.json()
    assert set(body) == STATUS_FIELDS
    assert body["role"] == "follower" and body["is_leader"] is False
    assert body["node_id"] == "node-b"
    assert body["leader"]["node_id"] == "node-a"
    assert body["leader"]["address"] == ADDRESS
    assert body["term"] == body["leader"]["term"] >= 1
    assert body["lease"] is None
    # The leader's own API says 200 at the same time: exactly one leader.
    head = await client.head("/leader")
    assert head.status == 503
    assert leader.elections["default"].status().is_leader


async def test_head_gives_status_without_body(api: Any) -> None:
    node, client = await api()
    await eventually(lambda: node.elections["default"].status().is_leader)
    resp = await client.head("/leader")
    assert resp.status == 200
    assert await resp.read() == b""
    node.elections["default"].resign(60)
    resp = await client.head("/leader/default")
    assert resp.status == 503


async def test_two_named_elections(api: Any) -> None:
    node, client = await api(["alpha", "beta"])
    await eventually(lambda: all(e.status().is_leader for e in node.elections.values()))
    node.elections["beta"].resign(60)
    alpha = await client.get("/leader/alpha")
    beta = await client.get("/leader/beta")
    assert alpha.status == 200 and (await alpha.json())["election"] == "alpha"
    assert beta.status == 503 and (await beta.json())["election"] == "beta"
    # No name with two elections and none called default: which one is ambiguous.
    resp = await client.get("/leader")
    assert resp.status == 404
    assert (await resp.json())["error"]["code"] == "unknown_election"


async def test_no_name_means_default_among_several(api: Any) -> None:
    node, client = await api(["default", "other"])
    await eventually(lambda: node.elections["default"].status().is_leader)
    node.elections["other"].resign(60)
    resp = await client.get("/leader")
    assert resp.status == 200
    assert (await resp.json())["election"] == "default"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/leader/nope"),
        ("HEAD", "/leader/nope"),
        ("GET", "/watch/nope?timeout=5"),
        ("POST", "/resign/nope"),
    ],
)
async def test_unknown_election_404(api: Any, method: str, path: str) -> None:
    node, client = await api()
    resp = await client.request(method, path)
    assert resp.status == 404
    if method != "HEAD":
        body = await resp.json()
        assert body["error"]["code"] == "unknown_election"
        assert "nope" in body["error"]["message"]
    assert node.elections["default"].watchers == 0


@pytest.mark.parametrize("path", ["/nope", "/leader/a/b", "/", "/leaderx", "/metrics/x"])
async def test_unknown_path_404_json(api: Any, path: str) -> None:
    _, client = await api()
    for method in ("GET", "POST", "DELETE"):
        resp = await client.request(method, path)
        assert resp.status == 404
        assert resp.content_type == "application/json"
        assert (await resp.json())["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/leader", "GET, HEAD, OPTIONS"),
        ("DELETE", "/leader/default", "GET, HEAD, OPTIONS"),
        ("GET", "/resign", "POST, OPTIONS"),
        ("PUT", "/resign/default", "POST, OPTIONS"),
        ("POST", "/watch", "GET, HEAD, OPTIONS"),
        ("DELETE", "/members", "GET, HEAD, OPTIONS"),
        ("POST", "/status", "GET, HEAD, OPTIONS"),
        ("PATCH", "/metrics", "GET, HEAD, OPTIONS"),
    ],
)
async def test_wrong_method_405_json_with_allow(
    api: Any, method: str, path: str, allow: str
) -> None:
    node, client = await api()
    resp = await client.request(method, path)
    assert resp.status == 405
    assert resp.headers["Allow"] == allow
    if method != "HEAD":
        assert (await resp.json())["error"]["code"] == "method_not_allowed"
    # The wrong method did nothing: still leading.
    await eventually(lambda: node.elections["default"].status().is_leader)


async def test_read_only_app_refuses_resign(api: Any) -> None:
    node, client = await api(read_only=True)
    election = node.elections["default"]
    await eventually(lambda: election.status().is_leader)
    for path in ("/resign", "/resign/default", "/resign?cooldown=5"):
        resp = await client.post(path)
        assert resp.status == 403
        assert (await resp.json())["error"]["code"] == "read_only"
    assert election.status().is_leader
    # Reading still works there.
    assert (await client.get("/leader")).status == 200
    assert (await client.get("/metrics")).status == 200


async def test_resign_answers_status_after_stepping_down(api: Any) -> None:
    node, client = await api()
    election = node.elections["default"]
    await eventually(lambda: election.status().is_leader)
    before = election.status()
    resp = await client.post("/resign?cooldown=60")
    assert resp.status == 200
    body = await resp.json()
    assert body["is_leader"] is False and body["role"] != "leader"
    assert body["lease"] is None
    assert body["revision"] > before.revision
    assert (await client.get("/leader")).status == 503
    # The cooldown holds: no campaigning for 60 s (three renew intervals is plenty to see it).
    await eventually(lambda: election.status().leader is None, timeout=3)
    assert not election.status().is_leader


async def test_resign_without_cooldown_campaigns_again(api: Any) -> None:
    node, client = await api()
    election = node.elections["default"]
    await eventually(lambda: election.status().is_leader)
    term = election.status().term
    resp = await client.post("/resign/default")
    assert resp.status == 200
    assert (await resp.json())["is_leader"] is False
    await eventually(lambda: election.status().is_leader and election.status().term == term + 1)


@pytest.mark.parametrize(
    "query",
    ["cooldown=abc", "cooldown=-1", "cooldown=nan", "cooldown=inf", "cooldown=86401", "cooldown="],
)
async def test_resign_bad_cooldown_400(api: Any, query: str) -> None:
    node, client = await api()
    election = node.elections["default"]
    await eventually(lambda: election.status().is_leader)
    resp = await client.post(f"/resign?{query}")
    assert resp.status == 400
    body = await resp.json()
    assert body["error"]["code"] == "bad_parameter"
    assert "cooldown" in body["error"]["message"]
    assert election.status().is_leader  # a refused request does not resign


GET_PATHS = [
    "/leader", "/leader/default", "/leader/nope", "/standby", "/standby/default",
    "/watch?timeout=0", "/watch/default?timeout=0", "/watch?timeout=-1", "/members",
    "/members/default", "/history", "/history/default?limit=0", "/status", "/health",
    "/ready", "/metrics", "/openapi.json", "/no/such/path", "/leaderx",
]  # fmt: skip


def same_answer(resp: Any) -> tuple[int, dict[str, str]]:
    """Status and headers, but the clock's and the (metrics) body length's."""
    varying = {"Date", "Content-Length", "Allow"}
    return resp.status, {k: v for k, v in resp.headers.items() if k not in varying}


async def test_head_and_options_answer_like_get_on_every_get_path(api: Any) -> None:
    """Patroni's HAProxy recipes check with `OPTIONS /leader`: it answered 200 on every
    node, so a balancer routed writes to followers."""
    node, client = await api(read_only=True)
    election = node.elections["default"]
    await eventually(lambda: election.status().is_leader)
    for leading in (True, False):
        if not leading:
            election.resign(60)
        for path in GET_PATHS:
            get = await client.get(path)
            for method in ("HEAD", "OPTIONS"):
                resp = await client.request(method, path)
                assert same_answer(resp) == same_answer(get), (method, path)
                if get.status != 404 and method == "OPTIONS":
                    assert resp.headers["Allow"] == "GET, HEAD, OPTIONS"
        leader = await client.options("/leader")
        assert leader.status == (200 if leading else 503)
        assert (await leader.json())["is_leader"] is leading


@pytest.mark.parametrize(("path", "allow"), [("/", "GET, HEAD, POST, OPTIONS"),
                                             ("/resign", "POST, OPTIONS")])  # fmt: skip
async def test_options_answers_200_with_allow_where_there_is_no_get(
    api: Any, path: str, allow: str
) -> None:
    """HAProxy's bare `option httpchk` sends `OPTIONS /`: it got 405."""
    _, client = await api(read_only=True)
    resp = await client.options(path)
    assert resp.status == 200
    assert resp.headers["Allow"] == allow
