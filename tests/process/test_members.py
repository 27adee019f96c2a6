"""Members and history with real daemons on every backend (docs/api.md, "Members",
"History"): three members with one leader, a SIGKILLed one stale after one ttl, and each
handover in the history with its end reason and a higher term. Its pruning, PRUNE_AFTER_TTLS
ttls later, is the backend contract's (tests/backends/test_contract_records.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.daemons import REPO, Daemon, leaders, short_tempdir, wait_for
from tests.support.etcd_fixtures import etcd_cluster  # noqa: F401 - the etcd URL's fixture
from tests.support.pg_fixtures import pg_server  # noqa: F401 - the PostgreSQL URLs' fixture

pytestmark = pytest.mark.slow

TTL = 2.0
# The standby SIGKILLed: the same rule on its own ttl (stale after one), so half the wait.
VICTIM_TTL = 1.0
SLACK = 3.0  # a busy 2-core machine
URLS: dict[str, Callable[[pytest.FixtureRequest, str], str]] = {
    "sqlite": lambda request, workdir: f"sqlite://{workdir}/leaderd.db",
    "postgresql": lambda request, workdir: str(
        request.getfixturevalue("pg_server").dsn(table=f"m_{uuid.uuid4().hex[:10]}")
    ),
    "postgresql+advisory": lambda request, workdir: str(
        request.getfixturevalue("pg_server").dsn(
            scheme="postgresql+advisory", table=f"m_{uuid.uuid4().hex[:10]}"
        )
    ),
    "etcd": lambda request, workdir: str(
        request.getfixturevalue("etcd_cluster").url(prefix=f"/leaderd-test/{uuid.uuid4().hex}/")
    ),
}
MARKS = {"postgresql": [pytest.mark.postgres], "postgresql+advisory": [pytest.mark.postgres]}


@pytest.fixture(params=[pytest.param(name, marks=MARKS.get(name, [])) for name in URLS])
def url(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, str]]:
    """(backend name, URL, work directory)."""
    workdir = short_tempdir()
    yield request.param, URLS[request.param](request, workdir), workdir
    subprocess.run(["rm", "-rf", workdir], check=False)


def start(node_id: str, url: str, workdir: str, ttl: float = TTL) -> Daemon:
    return Daemon(node_id, url, workdir=workdir, ttl=ttl, renew_interval=ttl / 4).start()


def the_leader(daemons: list[Daemon]) -> Daemon:
    found = wait_for(lambda: leaders(daemons), timeout=TTL + SLACK, what="a leader")
    assert len(found) == 1, [d.node_id for d in found]
    return found[0]


def members(d: Daemon) -> dict[str, Any]:
    code, body = d.get("/members")
    assert code == 200, body
    return dict(body)


def roles(d: Daemon) -> dict[str, str]:
    return {m["node_id"]: m["role"] for m in members(d)["members"]}


def term_of(d: Daemon) -> int:
    return int(d.get("/leader")[1]["term"])


def history(d: Daemon) -> list[dict[str, Any]]:
    code, body = d.get("/history?limit=100")
    assert code == 200, body
    return list(body["records"])


def test_members_and_history_through_handovers(url: tuple[str, str, str]) -> None:
    name, backend, workdir = url
    daemons = [start(f"node-{i}", backend, workdir) for i in range(2)]
    try:
        for d in daemons:
            d.wait_ready()
        first = the_leader(daemons)
        # The third joins as a standby, on the shorter ttl: the one SIGKILLed below.
        victim = start("node-2", backend, workdir, ttl=VICTIM_TTL)
        daemons.append(victim)
        victim.wait_ready()
        standbys = {d.node_id: "standby" for d in daemons if d is not first}
        expected = {first.node_id: "leader", **standbys}
        wait_for(lambda: all(roles(d) == expected for d in daemons), TTL + SLACK, what="3 members")
        listed = members(first)
        assert (listed["leader"], listed["healthy_standbys"], listed["cluster_size"]) == (
            first.node_id, 2, 3,
        )  # fmt: skip
        assert listed["cluster_ready"] and listed["members"][0]["node_id"] == first.node_id
        assert all(m["version"] and not m["conflict"] for m in listed["members"])

        # A standby SIGKILLed: stale after one ttl (and kept until PRUNE_AFTER_TTLS).
        victim.kill()
        stale = VICTIM_TTL + SLACK
        wait_for(lambda: roles(first).get(victim.node_id) == "stale", stale, what="stale")
        assert members(first)["healthy_standbys"] == 1
        live = [d for d in daemons if d is not victim]

        # Resign: the other one leads; then SIGKILL it: the first takes over.
        resigned = term_of(first)
        assert first.post("/resign")[0] == 200
        second = wait_for(
            lambda: [d for d in leaders(live) if d is not first], TTL + SLACK, what="handover"
        )[0]
        killed = term_of(second)
        second.kill()
        wait_for(lambda: first.is_leader(), 2 * TTL + SLACK, what="takeover")
        assert first.stop() == 0

        # The records survive: a new daemon reads the whole story.
        reader = start("reader", backend, workdir)
        reader.wait_ready()
        records = wait_for(lambda: history(reader)[1:], SLACK, what="history")
        by_term = {r["term"]: (r["holder"], r["end_reason"]) for r in records}
        # SQLite proves a SIGKILLed holder's death (its holder lock), once the holder has
        # recorded its proof: a hand-over's grant carries none until its first renewal.
        ttl_rule = "expired" if name == "etcd" else "taken over after expiry"
        taken = {ttl_rule, "holder died"} if name == "sqlite" else {ttl_rule}
        assert by_term[resigned] == (first.node_id, "resigned"), records
        assert by_term[killed][0] == second.node_id and by_term[killed][1] in taken, records
        # The first one's last term (a busy host may have cost it one on the way) it released.
        assert (records[0]["holder"], records[0]["end_reason"]) == (first.node_id, "released")
        terms = [r["term"] for r in records]
        assert terms == sorted(terms, reverse=True) and len(set(terms)) == len(terms)
        assert resigned < killed < records[0]["term"]
        assert all(r["ended_at"] >= r["acquired_at"] for r in records)
        check_cli(reader)
    finally:
        for d in daemons:
            d.kill()
        if "reader" in locals():
            reader.kill()


def check_cli(d: Daemon) -> None:
    """`leaderd members` and `leaderd history`: tables, --json, and a bad limit."""
    for code, body in (d.get(f"/history?limit={bad}") for bad in ("0", "abc", "101", "-1")):
        assert code == 400 and body["error"]["code"] == "bad_parameter", body
    table = cli("members", "--socket", d.socket)
    assert table.splitlines()[1].split()[:2] == ["MEMBER", "ROLE"] and "reader" in table
    assert json.loads(cli("members", "--socket", d.socket, "--json"))["leader"] == "reader"
    rows = cli("history", "--socket", d.socket, "--limit", "2").splitlines()
    assert rows[0].split()[:2] == ["TERM", "HOLDER"] and len(rows) == 3
    assert "(leading)" in rows[1] and "released" in rows[2]
    records = json.loads(cli("history", "--socket", d.socket, "--json"))["records"]
    assert records[0]["holder"] == "reader" and records[0]["ended_at"] is None


def cli(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "leaderd", *args],
        capture_output=True, text=True, check=True, cwd=REPO, timeout=30,
    )  # fmt: skip
    return out.stdout


def test_static_lists_its_one_member_and_keeps_its_history(tmp_path: Any) -> None:
    workdir = short_tempdir()
    try:
        for round_ in range(2):  # the second daemon reads the first one's record
            d = start("solo", "static://", workdir)
            d.wait_ready()
            wait_for(lambda d=d: roles(d) == {"solo": "leader"}, SLACK, what="the one member")
            assert members(d)["healthy_standbys"] == 0
            records = history(d)
            assert [r["end_reason"] for r in records] == [None, "released"][: round_ + 1]
            assert d.stop() == 0
    finally:
        d.kill()
        subprocess.run(["rm", "-rf", workdir], check=False)
