"""leaderd on etcd, side by side with etcd's own election on the same cluster: Debian's
etcd 3.4, three members on loopback with etcd's default raft timing (heartbeat 100 ms,
election 1 s), `--unsafe-no-fsync` like the bench's PostgreSQL unless fsync is asked for.

* graceful: three `etcdctl elect NAME PROPOSAL` candidates; SIGTERM the leader's etcdctl
  (it resigns on SIGTERM/SIGINT) and time until the next candidate prints its proposal.
  leaderd: bench/handover.py's graceful handover (three daemons, default timing).
* crash: `etcdctl elect` campaigns on a fixed 60 s session lease (no flag in etcdctl 3.4),
  so candidates from bench/etcd_candidate.py do the same on a 2 s lease (etcd's minimum with
  its default heartbeat) through etcd's JSON gateway; SIGKILL the leader and time until the
  next one prints its proposal: etcd's own lease expiry. leaderd: ttl 2 s, SIGKILL.
* steady state: two daemons, default timing, each on a member of its own, so that each
  member's gRPC counters (`grpc_server_started_total`) are one daemon's requests; and
  leaderd's own count (`leaderd_backend_request_seconds`) of backend calls.
* idle: the RSS of a daemon on etcd and of one on SQLite, and how long each takes from its
  start to `/ready`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import signal
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator
from typing import Any

from tests.support.daemons import Daemon, short_tempdir
from tests.support.etcd_cluster import EtcdCluster, Member
from tests.support.etcd_cluster import missing as _missing

from . import handover
from .common import (
    DAEMON_ARGS,
    DEFAULT_TIMING,
    SHORT_TIMING,
    Figure,
    judge,
    memory_mb,
    ms,
    summary,
    wait_ready,
)
from .etcdctl_election import Candidates, EventClock
from .ratios import alternate
from .unix_http import backend_requests, request

ETCDCTL = ["etcdctl", "--endpoints={client}", "elect", "{name}", "{proposal}"]
LEASE_TTL = 2
MAX_QPS = 1.0  # issue 11: backend requests per second per node at steady state
FAILOVER_SLACK = 0.100  # leaderd's crash failover: at most etcd's own lease expiry + this
# The gRPC methods leaderd's requests arrive as (the cluster's own health checks excluded).
LEADERD_METHODS = ("Range", "Txn", "LeaseGrant", "LeaseKeepAlive", "LeaseRevoke",
                   "LeaseTimeToLive", "Watch", "Authenticate")  # fmt: skip


def missing() -> str | None:
    """Why the etcd comparison cannot run here, or None."""
    return _missing()


@contextlib.asynccontextmanager
async def etcd_cluster(fsync: bool) -> AsyncIterator[EtcdCluster]:
    group = await asyncio.to_thread(EtcdCluster, 3, raft_defaults=True, fsync=fsync)
    try:
        yield group
    finally:
        await asyncio.to_thread(group.cleanup)


async def _rounds(client: str, command: list[str], signum: int, count: int) -> list[float]:
    async with Candidates(client, command) as group:
        return [await group.one(signum) for _ in range(count)]


async def _interleaved(
    client: str, url: str, prefix: str, count: int
) -> tuple[list[float], dict[str, Any]]:
    """etcdctl's and leaderd's (``url``, its keys under ``prefix``) graceful hand-overs on
    the same etcd, one of each in turn (ABBA): a burst of load on the shared machine falls
    on both. Each sample also records when a watching client heard etcd apply the write that
    ends the term (EventClock: etcdctl's election keys, and leaderd's leader key)."""
    graceful: list[float] = []
    applied: list[float | None] = []
    samples: list[dict[str, float]] = []
    async with Candidates(client, ETCDCTL) as etcdctl, \
            handover.prepared(url, DEFAULT_TIMING, "ho") as daemons, \
            EventClock(client, f"{etcdctl.name}/") as theirs, \
            EventClock(client, f"{prefix}{daemons.election}/leader") as clock:  # fmt: skip
        for etcdctl_first in alternate(count):
            for ours in (False, True) if etcdctl_first else (True, False):
                if ours:
                    sample = await handover.one_sample(daemons, signal.SIGTERM)
                    samples.append({**sample, "applied": clock.first_after(sample["signalled"])})
                else:
                    graceful.append(await etcdctl.one(signal.SIGTERM))
                    applied.append(theirs.first_after(etcdctl.signalled))
    data = handover.summarize(samples, DEFAULT_TIMING)
    data["applied"] = _summary([s["applied"] for s in samples])
    data["etcdctl_applied"] = _summary(applied)
    return graceful, data


def _summary(values: list[float | None]) -> dict[str, float]:
    return summary([v for v in values if v is not None])


def _grpc_started(member: Member) -> float:
    """Requests of leaderd's kinds this member has served so far."""
    with urllib.request.urlopen(member.client_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = re.compile(r'^grpc_server_started_total\{grpc_method="(\w+)".*\} (\S+)$', re.M)
    return sum(float(n) for method, n in pattern.findall(text) if method in LEADERD_METHODS)


async def _counts(daemon: Daemon, member: Member) -> tuple[dict[str, float], float]:
    return await backend_requests(daemon.socket), await asyncio.to_thread(_grpc_started, member)


async def steady(group: EtcdCluster, warmup: float, window: float) -> dict[str, Any]:
    """Requests per second of a leader and a follower, each alone on a member."""
    prefix = f"/bench-{uuid.uuid4().hex[:8]}/"
    workdir = short_tempdir("ldb-")
    members, timing = group.members[:2], dataclasses.asdict(DEFAULT_TIMING)
    urls = [group.url(prefix=prefix, members=[m]) for m in members]
    daemons = [
        Daemon(f"q-{i}", url, workdir=workdir, extra_args=DAEMON_ARGS, **timing)
        for i, url in enumerate(urls)
    ]
    try:
        for d in daemons:
            d.start()
            await wait_ready(d)
        await asyncio.sleep(warmup)
        before = [await _counts(d, m) for d, m in zip(daemons, members, strict=True)]
        await asyncio.sleep(window)
        after = [await _counts(d, m) for d, m in zip(daemons, members, strict=True)]
        roles = [(await request(d.socket, "/leader")).status == 200 for d in daemons]
    finally:
        for d in daemons:
            d.kill()
    nodes = {}
    for d, leads, (calls0, grpc0), (calls1, grpc1) in zip(
        daemons, roles, before, after, strict=True
    ):
        nodes["leader" if leads else "follower"] = {
            "node": d.node_id,
            "calls_per_s": (calls1["total"] - calls0["total"]) / window,
            "etcd_requests_per_s": (grpc1 - grpc0) / window,
            "calls": {op: n - calls0.get(op, 0.0) for op, n in calls1.items() if op != "total"},
        }
    return {"nodes": nodes, "window": window, "timing": dataclasses.asdict(DEFAULT_TIMING)}


async def idle(group: EtcdCluster, settle: float) -> dict[str, Any]:
    """RSS and start-to-ready time of one daemon on etcd and one on SQLite."""
    workdir = short_tempdir("ldb-")
    urls = {"etcd": group.url(prefix=f"/bench-{uuid.uuid4().hex[:8]}/"),
            "sqlite": f"sqlite://{workdir}/idle.db"}  # fmt: skip
    found = {}
    for name, url in urls.items():
        daemon = Daemon(f"idle-{name}", url, workdir=workdir, extra_args=DAEMON_ARGS)
        try:
            t0 = time.monotonic()
            daemon.start()
            await wait_ready(daemon)
            ready = time.monotonic() - t0
            await asyncio.sleep(settle)
            found[name] = {"ready_s": ready, **memory_mb(daemon.pid)}
        finally:
            daemon.kill()
    return found


async def reference(count: int, fsync: bool, leaderd: bool) -> tuple[list[Figure], Any]:
    """`etcdctl elect`'s graceful hand-over, the yardstick of every backend's hand-over in
    this run (ratios()); with ``leaderd``, leaderd's own on the same etcd cluster."""
    async with etcd_cluster(fsync) as group:
        client, ours = group.members[0].client_url, None
        if leaderd:
            prefix = f"/bench-{uuid.uuid4().hex[:8]}/"
            graceful, ours = await _interleaved(client, group.url(prefix=prefix), prefix, count)
        else:
            graceful = await _rounds(client, ETCDCTL, signal.SIGTERM, count)
    data = {"fsync": fsync, "etcdctl_graceful": {**summary(graceful), "samples": graceful},
            "leaderd_graceful": ours}  # fmt: skip
    g = data["etcdctl_graceful"]
    where = f"etcdctl{'' if fsync else ' (no fsync)'}"
    rows = [
        Figure("handover", where, "etcdctl elect graceful handover p50", ms(g["p50"]), "ms",
               note=f"n={g['n']}; 3 members; SIGTERM to etcdctl (it resigns)"),
        Figure("handover", where, "etcdctl elect graceful handover p99", ms(g["p99"]), "ms",
               note=f"max {ms(g['max']):.1f} ms"),
    ]  # fmt: skip
    if ours is not None:
        rows += handover.handover_figures("etcd", ours)
        rows += applied_figures(where, ours)
    return rows, data


def applied_figures(where: str, ours: dict[str, Any]) -> list[Figure]:
    """When a watching client heard etcd apply the write ending the term: etcdctl's resign
    (a delete) and leaderd's grant (a transaction), each from its signal."""
    rows = []
    for backend, name, found in (
        (where, "etcdctl: resign applied, heard by a watcher", ours["etcdctl_applied"]),
        ("etcd", "  leaderd: grant applied, heard by a watcher", ours["applied"]),
    ):
        if found["n"]:
            note = f"p99 {ms(found['p99']):.2f} ms, n={found['n']}"
            rows.append(Figure("handover", backend, name + " p50", ms(found["p50"]), "ms",
                               note=note))  # fmt: skip
    return rows


async def measure(
    handovers: int, failovers: int, fsync: bool, window: float = 30.0, settle: float = 3.0
) -> tuple[list[Figure], Any]:
    python = [
        sys.executable, "-m", "bench.etcd_candidate", "--endpoint", "{client}",
        "--name", "{name}", "--proposal", "{proposal}", "--ttl", str(LEASE_TTL),
    ]  # fmt: skip
    async with etcd_cluster(fsync) as group:
        client, prefix = group.members[0].client_url, "/bench/"
        url = group.url(prefix=prefix)
        graceful, ours = await _interleaved(client, url, prefix, handovers)
        crash = await _rounds(client, python, signal.SIGKILL, failovers)
        ours_crash = await handover.measure("etcd", url, failovers, signal.SIGKILL, SHORT_TIMING)
        rates = await steady(group, min(5.0, window / 4), window)
        memory = await idle(group, settle)
    data = {
        "fsync": fsync,
        "members": 3,
        "etcdctl_graceful": {**summary(graceful), "samples": graceful},
        "leaderd_graceful": ours,
        "etcd_crash": {**summary(crash), "samples": crash, "lease_ttl": LEASE_TTL},
        "leaderd_crash": ours_crash,
        "steady": rates,
        "idle": memory,
    }
    return figures(data), data


REFERENCE = "handover etcdctl"  # the step label of reference()


def ratios(results: dict[str, Any]) -> list[Figure]:
    """Every backend's graceful hand-over against `etcdctl elect` in the same run (the
    target: a ratio at or below 1.0 at p50 and at p99 of the first follower's answer; the
    time until every follower agrees is shown against the same etcdctl figure)."""
    runs = [results.get(label) for label in (REFERENCE, "etcd")]
    peer = next((run["etcdctl_graceful"] for run in runs if run), None)
    if not peer:
        return []
    ours = {label.partition(" ")[2]: data for label, data in results.items()
            if label.startswith("handover ") and label != REFERENCE and data}  # fmt: skip
    for run in runs:
        if run and run.get("leaderd_graceful"):
            ours["etcd"] = run["leaderd_graceful"]
    rows = []
    for backend, data in ours.items():
        first, agree = data["first"], data["all"]
        for q in ("p50", "p99"):
            ratio = first[q] / peer[q]
            rows.append(
                Figure("vs etcd", backend, f"graceful handover {q} / etcdctl's", ratio, "x",
                       "<= 1.0", ratio <= 1.0,
                       note=f"{ms(first[q]):.2f} ms against {ms(peer[q]):.2f} ms; all agree "
                            f"{ms(agree[q]):.2f} ms ({agree[q] / peer[q]:.2f}x)"),
            )  # fmt: skip
    return rows


def figures(data: dict[str, Any]) -> list[Figure]:
    """Each leaderd figure right under etcd's own, judged against it."""
    where = f"etcd x3{'' if data['fsync'] else ' (no fsync)'}"
    g, ours = data["etcdctl_graceful"], data["leaderd_graceful"]["first"]
    agree = data["leaderd_graceful"]["all"]
    c, ours_c = data["etcd_crash"], data["leaderd_crash"]["first"]
    rows = [
        Figure("etcd", where, "etcdctl elect graceful handover p50", ms(g["p50"]), "ms",
               note=f"n={g['n']}; SIGTERM to etcdctl (it resigns)"),
        Figure("etcd", where, "  leaderd graceful handover p50", ms(ours["p50"]), "ms",
               f"<= {ms(g['p50']):.1f} ms", judge(ours["p50"], g["p50"]), note=f"n={ours['n']}"),
        Figure("etcd", where, "etcdctl elect graceful handover p99", ms(g["p99"]), "ms",
               note=f"max {ms(g['max']):.1f} ms"),
        Figure("etcd", where, "  leaderd graceful handover p99", ms(ours["p99"]), "ms",
               f"<= {ms(g['p99']):.1f} ms", judge(ours["p99"], g["p99"]),
               note=f"max {ms(ours['max']):.1f} ms"),
        Figure("etcd", where, "    all followers agree p50/p99", ms(agree["p50"]), "ms",
               note=f"p99 {ms(agree['p99']):.1f} ms"),
        Figure("etcd", where, "etcd lease crash failover p50", ms(c["p50"]), "ms",
               note=f"n={c['n']}; v3election Campaign, {LEASE_TTL} s lease, SIGKILL"),
        Figure("etcd", where, "  leaderd crash failover p50", ms(ours_c["p50"]), "ms",
               note=f"n={ours_c['n']}; ttl {SHORT_TIMING.ttl:g} s, SIGKILL"),
        Figure("etcd", where, "etcd lease crash failover p99", ms(c["p99"]), "ms",
               note=f"max {ms(c['max']):.0f} ms"),
        Figure("etcd", where, "  leaderd crash failover p99", ms(ours_c["p99"]), "ms",
               f"<= {ms(c['p99'] + FAILOVER_SLACK):.0f} ms",
               judge(ours_c["p99"], c["p99"] + FAILOVER_SLACK),
               note=f"max {ms(ours_c['max']):.0f} ms"),
    ]  # fmt: skip
    for role, node in sorted(data["steady"]["nodes"].items()):
        for what, key in (
            ("etcd requests/s", "etcd_requests_per_s"),
            ("backend calls/s", "calls_per_s"),
        ):
            note = (
                "counted by the member (gRPC)"
                if key.startswith("etcd")
                else ", ".join(f"{op} {n:g}" for op, n in sorted(node["calls"].items()) if n)
            )
            rows.append(Figure("qps", "etcd", f"{what}, {role}", node[key], "q/s",
                               f"<= {MAX_QPS:g} q/s", node[key] <= MAX_QPS, note=note))  # fmt: skip
    for name, found in data["idle"].items():
        note = f"private {found.get('anon', 0):.1f} MB, PSS {found.get('pss', 0):.1f} MB"
        rows.append(Figure("rss", name, "RSS idle", found["rss"], "MB", note=note))
        rows.append(Figure("rss", name, "start to ready", ms(found["ready_s"]), "ms"))
    return rows
