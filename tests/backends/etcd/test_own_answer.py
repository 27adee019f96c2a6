"""Only a request's own answer makes a leader (docs/algorithm.md), on real daemons and the
real 3-member cluster: a standby whose round kept its spare lease alive and then failed,
and whose next round answered from a watch event without a request, must not lead on a
grant of that spare from a later send time than its keepalive's.

The sequence, forced with a fault proxy on the standby's gateway traffic (gateway_proxy.py):

1. node-a leads; node-b and node-c stand by, each with a spare lease. node-c is frozen.
2. node-a resigns to node-c: the lease is reserved for node-c. node-b's rounds read the
   election and keep their spare alive, then fail on the reservation's timetolive call,
   which the proxy refuses.
3. node-b is cut off from every request but its watch, for CUT_OFF seconds: its rounds
   fail, none keeps the spare alive. node-c resumes and acquires; the watch event names it,
   and node-b's next round answers from it without a request.
4. node-c is stopped (SIGTERM): its release grants the lease to node-b's spare, last kept
   alive by a round that failed. node-b hears of it by its watch, then loses that too.
5. etcd's lessor expires that spare (node-b cannot renew it). From then on node-b must not
   answer "leader": its deadline counts from a send time before that keepalive, or it
   does not lead at all. On the code before the rule, it led until CUT_OFF seconds later.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from leaderd.clock import boottime
from tests.backends.etcd.gateway_proxy import PASS, REFUSE, WATCH, GatewayProxy
from tests.support.daemons import Daemon, short_tempdir, wait_for
from tests.support.etcd_cluster import EtcdCluster

pytestmark = pytest.mark.slow

TTL, RENEW, RETRY = 4.0, 1.5, 0.5
TIMETOLIVE, KEEPALIVE = "/v3/kv/lease/timetolive", "/v3/lease/keepalive"
# How long after that keepalive node-b answers from the watch event: what a grant counting
# from that answer's send time would add to the spare's real life.
CUT_OFF = 2.0


@pytest.fixture
def trio(etcd: EtcdCluster, proxy: GatewayProxy) -> Iterator[tuple[Daemon, Daemon, Daemon]]:
    """node-a leading; node-b (through the proxy, to one member) and node-c standing by."""
    workdir, prefix = short_tempdir(), f"/leaderd-test/{uuid.uuid4().hex[:10]}/"
    url = etcd.url(prefix=prefix)
    proxied = f"etcd://127.0.0.1:{proxy.port}/?prefix={prefix}"
    a, b, c = (Daemon(f"node-{n}", u, workdir=workdir, ttl=TTL, renew_interval=RENEW,
                      retry_interval=RETRY)
               for n, u in (("a", url), ("b", proxied), ("c", url)))  # fmt: skip
    try:
        a.start().wait_ready()
        wait_for(lambda: a.is_leader(), timeout=10, what="node-a leading")
        for d in (b, c):
            d.start().wait_ready()
        for who in ("node-b", "node-c"):  # each offers its spare, and node-a lists it
            wait_for(lambda w=who: candidate(etcd, prefix, w), timeout=10, what=f"{who}'s spare")
            wait_for(lambda w=who: w in standbys(a), timeout=10, what=f"{who} a standby")
        yield a, b, c
    finally:
        for d in (a, b, c):
            with_resumed(d)
            d.kill()
        subprocess.run(["rm", "-rf", workdir], check=False)


def candidate(etcd: EtcdCluster, prefix: str, node_id: str) -> bool:
    out = etcd.etcdctl("get", "--prefix", f"{prefix}default/candidates/{node_id}/", "--keys-only")
    return bool(out.strip())


def standbys(d: Daemon) -> list[str]:
    members = d.get("/members")[1]["members"]
    return [m["node_id"] for m in members if m["role"] == "standby"]


def with_resumed(d: Daemon) -> None:
    if d.alive():
        d.signal(signal.SIGCONT)


def leader_path(backend: str) -> str:
    return backend.split("prefix=", 1)[1].split("&", 1)[0] + "default/leader"


def leader_key(etcd: EtcdCluster, backend: str) -> tuple[dict[str, Any] | None, int]:
    """The leader key's value and its lease id (0 when there is no key)."""
    value, kv = etcd.get(leader_path(backend))
    return (None, 0) if value is None else (json.loads(value), int(kv.get("lease", 0)))


def granted_to(etcd: EtcdCluster, d: Daemon) -> tuple[dict[str, Any], int] | None:
    """The leader key and its lease while ``d`` holds it."""
    value, lease = leader_key(etcd, d.backend)
    return (value, lease) if value is not None and value["node_id"] == d.node_id else None


def named_leader(d: Daemon) -> str | None:
    _, body = d.get("/leader")
    leader = (body or {}).get("leader") or {}
    return leader.get("node_id")


def test_a_grant_of_a_spare_kept_by_a_failed_round_never_outlives_the_spare(
    etcd: EtcdCluster, proxy: GatewayProxy, trio: tuple[Daemon, Daemon, Daemon]
) -> None:
    a, b, c = trio
    c.signal(signal.SIGSTOP)
    proxy.fault(REFUSE, {TIMETOLIVE})
    since = boottime()
    code, _ = a.post(f"/resign?to={c.node_id}&cooldown=60")
    assert code == 200

    def kept_then_refused() -> bool:
        kept = proxy.requests(KEEPALIVE, since=since, fault=PASS)
        return bool(kept) and bool(proxy.requests(TIMETOLIVE, since=kept[-1].at, fault=REFUSE))

    # A round of node-b that kept its spare alive, then failed on the reservation's lease.
    wait_for(kept_then_refused, timeout=10, what="a keepalive, then a refused timetolive")
    proxy.fault_all_but(REFUSE, {WATCH})  # node-b is cut off from etcd but for its watch
    time.sleep(CUT_OFF)  # node-b's rounds fail, none keeps its spare alive
    c.signal(signal.SIGCONT)
    wait_for(lambda: named_leader(b) == c.node_id, timeout=5, what="node-b naming node-c")
    wait_for(lambda: c.is_leader(), timeout=5, what="node-c leading")
    c.signal(signal.SIGTERM)
    granted, spare = wait_for(lambda: granted_to(etcd, b), timeout=5, what="a grant to node-b")
    assert granted["term"] == 3 and c.wait() == 0  # after node-a's term 1 and node-c's 2
    # node-b hears of the grant by its watch, then loses that too.
    _, kv = etcd.get(leader_path(b.backend))
    wait_for(lambda: proxy.delivered(f'"mod_revision":"{kv["mod_revision"]}"'), timeout=5,
             what="the grant's watch event on its way to node-b")  # fmt: skip
    proxy.cut()
    # etcd's lessor deletes the key once node-b's spare expires: node-b, cut off, cannot renew.
    wait_for(lambda: leader_key(etcd, b.backend)[1] != spare, timeout=TTL + 3, what="expiry")
    code, body = b.get("/leader")
    assert code != 200, f"node-b still leads after etcd expired its lease: {body}"
