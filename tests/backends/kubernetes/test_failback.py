"""--failback on kubernetes://, which cannot reserve the released Lease for one node: the
leader that hands back to a standby of higher priority then cools down for one ttl, so the
preferred node takes the free Lease instead of the old leader winning it back and handing
it over again every DELAY (docs/algorithm.md, "Who leads"). Real daemons, a real API server,
a referee over every answer."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from tests.backends.kubernetes.referee import MixedReferee
from tests.support.daemons import Daemon, wait_for
from tests.support.kube_cluster import NAMESPACE, ControlPlane

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow, pytest.mark.timeout(120)]

TTL = 2.0
DELAY = 1.0  # --failback: the standby of higher priority is seen this long first


def records_since(d: Daemon, term: int) -> list[tuple[int, str, str | None]]:
    """(term, holder, end reason) of every term from ``term`` on, oldest first."""
    records = d.get("/history?limit=100")[1]["records"]
    return [
        (r["term"], r["holder"], r["end_reason"]) for r in reversed(records) if r["term"] >= term
    ]


def heard_campaigning_since(leader: Daemon, node_id: str, since: str) -> bool:
    """``leader`` lists ``node_id`` campaigning in a heartbeat after ``since``."""
    listed = leader.get("/members")[1]["members"]
    return any(m["node_id"] == node_id and m["campaigning"] and m["last_heard_at"] > since
               for m in listed)  # fmt: skip


def test_the_preferred_node_takes_the_lease_once_and_keeps_it(
    kube: ControlPlane, tmp_path: Path, workdir: str
) -> None:
    kubeconfig = kube.restricted.kubeconfig(str(tmp_path / "daemon.kubeconfig"))
    url = f"kubernetes:///{NAMESPACE}?lease-prefix=f{uuid.uuid4().hex[:8]}-&kubeconfig={kubeconfig}"

    def start(node_id: str, *args: str) -> Daemon:
        return Daemon(node_id, url, workdir=workdir, ttl=TTL, renew_interval=0.5,
                      retry_interval=0.25, extra_args=args).start()  # fmt: skip

    a = start("node-a", "--priority", "1", "--failback", str(DELAY))
    wait_for(a.is_leader, timeout=30, what="node-a to lead")
    first = a.get("/leader")[1]["term"]
    b = start("node-b", "--priority", "2")
    with MixedReferee([a, b], []) as referee:
        wait_for(b.is_leader, timeout=30, what="node-b, preferred, to lead")
        referee.wait_seen(b)
        since = b.get("/leader")[1]["leader"]["acquired_at"]
        # node-a's cooldown is over and it campaigns again: had it won the Lease back, it
        # would hand it over again DELAY after; give that two DELAYs to show.
        wait_for(lambda: heard_campaigning_since(b, "node-a", since), timeout=30,
                 what="node-a to campaign again")  # fmt: skip
        time.sleep(2 * DELAY)
        assert b.is_leader()
        changes = records_since(b, first)
    assert changes[0] == (first, "node-a", "handed over: failback to node-b"), changes
    assert [(term, holder) for term, holder, _ in changes[1:]] == [(changes[1][0], "node-b")], (
        changes
    )
    for d in (a, b):
        assert d.stop() == 0
