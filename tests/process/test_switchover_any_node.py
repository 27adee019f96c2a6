"""Switchover from any node with real daemons on SQLite (docs/api.md, "Switchover from any
node"): `leaderd switchover --to NODE` on a follower hands the election to NODE and waits
until it leads; a scheduled one survives its leader's stop and is carried out by the next
leader; the TCP listener refuses it; one to a node that never becomes able expires. The
referee judges every /leader answer."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.process.test_members import MARKS, URLS
from tests.support.daemons import Daemon, curl, leaderd_cli, leaders, short_tempdir, wait_for
from tests.support.etcd_fixtures import etcd_cluster  # noqa: F401 - the etcd URL's fixture
from tests.support.pg_fixtures import pg_server  # noqa: F401 - the PostgreSQL URLs' fixture
from tests.support.referee import Referee

pytestmark = pytest.mark.slow

TTL = 2.0
SLACK = 5.0


GRANTING = [name for name in URLS if name != "postgresql+advisory"]


@pytest.fixture(params=[pytest.param(name, marks=MARKS.get(name, [])) for name in GRANTING])
def granting(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(URL, work directory) of each backend that grants (so priorities pick the heir)."""
    workdir = short_tempdir()
    yield URLS[request.param](request, workdir), workdir
    shutil.rmtree(workdir, ignore_errors=True)


def start(node_id: str, workdir: str, *more: str, backend: str = "") -> Daemon:
    backend = backend or f"sqlite://{workdir}/lease.db"
    return Daemon(node_id, backend, workdir=workdir, ttl=TTL, extra_args=list(more)).start()


def cluster(workdir: str, *priorities: int, backend: str = "") -> list[Daemon]:
    first = start("node-a", workdir, "--priority", str(priorities[0]), backend=backend)
    wait_for(first.is_leader, TTL + SLACK, what="node-a leads")
    rest = [start(f"node-{n}", workdir, "--priority", str(p), backend=backend)
            for n, p in zip("bc", priorities[1:], strict=True)]  # fmt: skip
    daemons = [first, *rest]
    for d in daemons:
        listed = lambda d=d: [m for m in d.get("/members")[1]["members"] if m["campaigning"]]  # noqa: E731
        wait_for(lambda listed=listed: len(listed()) == 3, TTL + SLACK, what="every member")
    return daemons


def pending(d: Daemon) -> list[dict[str, str]]:
    return list(d.get("/switchover")[1]["pending"])


def test_switchover_from_a_follower_waits_until_the_node_leads(workdir: str) -> None:
    daemons = cluster(workdir, 1, 1, 1)
    a, b, c = daemons
    with Referee(daemons):
        done = leaderd_cli("switchover", "--socket", c.socket, "--to", "node-b", "--timeout",
                           str(TTL + SLACK))  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("node-b leads election default, term ")
        assert leaders(daemons) == [b]
        wait_for(lambda: pending(c) == [] and pending(b) == [], TTL + SLACK,
                 what="the request withdrawn once done")  # fmt: skip
        refused = leaderd_cli("switchover", "--socket", a.socket, "--to", "node-b")
        assert refused.returncode == 1 and "node-b already leads" in refused.stderr
    for d in daemons:
        assert d.stop() == 0


def test_a_scheduled_switchover_outlives_its_leader(granting: tuple[str, str]) -> None:
    """node-c asks for node-c at T; node-a, the leader, stops before T; node-b (priority 2)
    is granted the lease and carries the request out at T. On every backend that grants."""
    backend, workdir = granting
    daemons = cluster(workdir, 1, 2, 1, backend=backend)
    a, b, c = daemons
    with Referee(daemons):
        at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3 * TTL)
        done = leaderd_cli("switchover", "--socket", c.socket, "--to", "node-c", "--at",
                           at.isoformat(), "--timeout", "30")  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert [p["to"] for p in pending(c)] == ["node-c"]
        assert a.stop() == 0
        wait_for(b.is_leader, TTL + SLACK, what="node-b leads after node-a stopped")
        wait_for(lambda: [p["requested_by"] for p in pending(b)] == ["node-c"], TTL + SLACK,
                 what="the new leader sees the request")  # fmt: skip
        assert leaders([b, c]) == [b]  # not before its time
        wait_for(c.is_leader, 3 * TTL + SLACK, what="node-c leads at its time")
        assert dt.datetime.now(dt.UTC) >= at
    for d in (b, c):
        assert d.stop() == 0


def test_a_switchover_that_cannot_be_done_in_time_expires(workdir: str) -> None:
    """Asked for node-b from 2 s to 3 s from now; node-b stops first: nobody carries it out,
    and it is gone once expired."""
    daemons = cluster(workdir, 1, 1, 1)
    a, b, c = daemons
    with Referee(daemons):
        at = time.time() + 2.0
        code, body = curl(c.socket, f"/switchover?to=node-b&at={at:.3f}&timeout=1", method="POST")
        assert code == 202 and [p["to"] for p in body["pending"]] == ["node-b"]
        assert b.stop() == 0
        while time.time() < at + 1.0:
            assert leaders(daemons) == [a]
            time.sleep(0.05)
        wait_for(lambda: pending(c) == [] and pending(a) == [], TTL + SLACK,
                 what="the request expired")  # fmt: skip
        assert curl(c.socket, "/switchover", method="DELETE")[0] == 404  # nothing to withdraw
        assert leaders(daemons) == [a]
    for d in (a, c):
        assert d.stop() == 0


def test_only_the_unix_socket_may_ask_or_cancel(workdir: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    d = start("node-a", workdir, "--listen", f"127.0.0.1:{port}")
    wait_for(d.is_leader, TTL + SLACK, what="node-a leads")
    for method in ("POST", "DELETE"):
        url = f"http://127.0.0.1:{port}/switchover?to=node-b"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5)
        assert refused.value.code == 403
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/switchover", timeout=5) as answer:
        assert json.loads(answer.read()) == {"election": "default", "pending": []}
    assert d.stop() == 0
