"""Priorities with real daemons on SQLite (docs/algorithm.md, "Who leads"): a stop or a
resign without --to hands the lease to the standby of the highest priority, and a witness
(--priority 0) is listed but never leads, even as the last node. The referee judges every
/leader answer."""

from __future__ import annotations

import time

import pytest

from tests.process.test_switchover_any_node import granting  # noqa: F401 - backends that grant
from tests.support.daemons import Daemon, end_of, leaders, wait_for
from tests.support.etcd_fixtures import etcd_cluster  # noqa: F401 - the etcd URL's fixture
from tests.support.pg_fixtures import pg_server  # noqa: F401 - the PostgreSQL URLs' fixture
from tests.support.referee import Referee

pytestmark = pytest.mark.slow

TTL = 2.0
SLACK = 5.0


def start(node_id: str, workdir: str, priority: int) -> Daemon:
    return Daemon(node_id, f"sqlite://{workdir}/lease.db", workdir=workdir, ttl=TTL,
                  extra_args=["--priority", str(priority)]).start()  # fmt: skip


def roles(d: Daemon) -> dict[str, str]:
    return {m["node_id"]: m["role"] for m in d.get("/members")[1]["members"]}


def campaigning(d: Daemon) -> dict[str, str]:
    """The roles of the members as the leader ``d`` lists them, once each of them was heard
    campaigning since ``d`` began its term (a list from before may show a node that has
    resigned since as campaigning)."""
    leader = d.get("/leader")[1]["leader"]
    if leader is None:
        return {}
    since = leader["acquired_at"]
    listed = d.get("/members")[1]["members"]
    if all(m["campaigning"] and m["last_heard_at"] > since for m in listed):
        return {m["node_id"]: m["role"] for m in listed}
    return {}


def test_a_resign_and_a_stop_hand_over_to_the_highest_priority(workdir: str) -> None:
    """node-c (priority 5) is chosen every time over node-a and node-b (priority 1), however
    fresh they are: by a resign of either, and by the stop of either."""
    first = start("node-a", workdir, 1)
    wait_for(first.is_leader, TTL + SLACK, what="node-a leads")
    low, high = start("node-b", workdir, 1), start("node-c", workdir, 5)
    daemons = [first, low, high]
    listed = {"node-a": "standby", "node-b": "standby", "node-c": "standby"}
    with Referee(daemons):
        for turn in range(4):
            leader = wait_for(lambda: leaders(daemons), TTL + SLACK, what="a leader")[0]
            assert leader is not high
            expected = {**listed, leader.node_id: "leader"}
            wait_for(lambda: campaigning(leader) == expected, TTL + SLACK,  # noqa: B023
                     what="every standby listed, campaigning")  # fmt: skip
            if turn < 3:
                assert leader.post("/resign?cooldown=0")[0] == 200
            else:
                assert leader.stop() == 0
            wait_for(high.is_leader, TTL + SLACK, what="node-c leads")
            if turn < 3:
                assert high.post("/resign?cooldown=0")[0] == 200  # to node-a or node-b
    for d in daemons:
        assert d.stop() == 0


def test_a_witness_is_listed_and_never_leads_even_alone(workdir: str) -> None:
    leader, witness = start("node-a", workdir, 1), start("node-w", workdir, 0)
    with Referee([leader, witness]):
        wait_for(leader.is_leader, TTL + SLACK, what="node-a leads")
        wait_for(lambda: roles(leader).get("node-w") == "witness", TTL + SLACK,
                 what="the witness listed")  # fmt: skip
        assert leader.stop() == 0
        time.sleep(TTL + 1.0)  # longer than any takeover
        assert not witness.is_leader()
        assert roles(witness)["node-w"] == "witness"
    assert witness.stop() == 0


@pytest.mark.parametrize("failback", [True, False])
def test_failback_hands_back_to_a_higher_priority_standby(
    granting: tuple[str, str],  # noqa: F811 - the fixture
    failback: bool,
) -> None:
    """--failback 1: node-a (priority 1) leads, node-b (priority 2) comes up; node-a hands it
    over once it has seen node-b able for 1 s. Without --failback node-a keeps it. On every
    backend that grants."""
    backend, workdir = granting
    more = ["--failback", "1"] if failback else []
    a = Daemon("node-a", backend, workdir=workdir, ttl=TTL,
               extra_args=["--priority", "1", *more]).start()  # fmt: skip
    wait_for(a.is_leader, TTL + SLACK, what="node-a leads")
    b = Daemon("node-b", backend, workdir=workdir, ttl=TTL,
               extra_args=["--priority", "2"]).start()  # fmt: skip
    with Referee([a, b]):
        wait_for(lambda: roles(a).get("node-b") == "standby", TTL + SLACK, what="node-b listed")
        if failback:
            wait_for(b.is_leader, 1.0 + TTL + SLACK, what="the failback")
            term = b.get("/leader")[1]["term"]
            assert end_of(b, term - 1)[2] in ("handed over to node-b",
                                             "handed over: failback to node-b")  # fmt: skip
        else:
            time.sleep(1.0 + TTL)
            assert leaders([a, b]) == [a]
    for d in (a, b):
        assert d.stop() == 0
