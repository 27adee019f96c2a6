"""The time of one etcd request as a hand-over meets it: after an idle gap (cold caches in
every process on the path) and back to back, through etcd's JSON gateway and over gRPC.

    python -m bench.etcd_request_cost [--gap 0.4] [--count 25] [--watchers 4]

Starts three etcd members with etcd's own raft timing and no fsync (as the bench does),
``--watchers`` `etcdctl watch` processes on the keys (a hand-over's write is heard by every
daemon), and times each request from its send to its answer, sent to the raft leader and to
a follower (which forwards it: the bench's clients talk to the first member, whichever it
is), the kinds interleaved:

* ``gateway put``: a put through the JSON gateway over aiohttp (leaderd's client);
* ``gateway grant``: the shape of leaderd's grant (two compares; the leader key put under a
  lease, the term, the candidate key deleted, the end and history records put);
* ``gateway grant + trim``: the same with the two range deletes that trim the history;
* ``grpc put``, ``grpc delete``: over gRPC (aetcd), when the interpreter has it: etcdctl's
  resign is a gRPC delete. aetcd is not a leaderd dependency: run this from a virtualenv
  that has it, with the repository on PYTHONPATH.

Prints one JSON line: p50 and p90 of each, in ms. docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import uvloop

from tests.support.etcd_cluster import EtcdCluster, Member

from .common import percentile

Request = Callable[[int], Awaitable[Any]]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def grant(i: int, lease: int, trim: bool) -> dict[str, Any]:
    """A grant transaction's shape, for term ``i``."""
    success: list[dict[str, Any]] = [
        {"request_put": {"key": b64("c/leader"), "value": b64("h" * 150), "lease": lease}},
        {"request_put": {"key": b64("c/term"), "value": b64(str(i))}},
        {"request_delete_range": {"key": b64("c/candidate")}},
        {"request_put": {"key": b64(f"c/ended/{i:020d}"), "value": b64("e" * 120)}},
        {"request_put": {"key": b64(f"c/history/{i + 1:020d}"), "value": b64("r" * 150)}},
    ]
    if trim:
        oldest = max(0, i - 100)
        success += [
            {"request_delete_range": {"key": b64(f"c/{kind}/"),
                                      "range_end": b64(f"c/{kind}/{oldest:020d}")}}
            for kind in ("history", "ended")
        ]  # fmt: skip
    compare = [
        {"key": b64("c/leader"), "target": "MOD", "result": "GREATER", "mod_revision": "0"},
        {"key": b64("c/candidate"), "target": "MOD", "result": "EQUAL", "mod_revision": "0"},
    ]
    return {"compare": compare, "success": success}


async def grpc_requests(host: str, port: int) -> tuple[dict[str, Request], Any]:
    """aetcd's put and delete, or none where aetcd is not installed."""
    try:
        import aetcd  # type: ignore[import-not-found]
    except ImportError:
        return {}, None
    client = aetcd.Client(host=host, port=port)
    await client.connect()

    async def put(i: int) -> Any:
        return await client.put(b"c/x", str(i).encode())

    async def delete(i: int) -> Any:
        return await client.delete(b"c/x")

    return {"grpc put": put, "grpc delete": delete}, client


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    cluster = EtcdCluster(3, raft_defaults=True)
    try:
        cluster.wait_healthy()
        leader = cluster.leader()
        assert leader is not None, "no raft leader"
        follower = next(m for m in cluster.members if m is not leader)
        watch = ["etcdctl", f"--endpoints={follower.client_url}", "watch", "--prefix", "c/"]
        watchers = [
            await asyncio.create_subprocess_exec(*watch, stdout=asyncio.subprocess.DEVNULL)
            for _ in range(args.watchers)
        ]
        try:
            ms = {role: await _times(member, args) for role, member in
                  (("to the raft leader", leader), ("to a follower", follower))}  # fmt: skip
        finally:
            for process in watchers:
                process.kill()
                await process.wait()
    finally:
        cluster.cleanup()
    return {"gap_s": args.gap, "watchers": args.watchers, "count": args.count, "ms": ms}


async def _times(member: Member, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """p50 and p90 of each kind of request sent to ``member``, in ms."""
    host, port = member.hostport.rsplit(":", 1)
    async with aiohttp.ClientSession() as http:

        async def post(path: str, body: dict[str, Any]) -> Any:
            async with http.post(member.client_url + path, json=body) as response:
                return await response.read()

        lease = json.loads(await post("/v3/lease/grant", {"TTL": 600}))["ID"]
        put = {"key": b64("c/x"), "value": b64("v")}
        kinds: dict[str, Request] = {
            "gateway put": lambda i: post("/v3/kv/put", put),
            "gateway grant": lambda i: post("/v3/kv/txn", grant(i, lease, False)),
            "gateway grant + trim": lambda i: post("/v3/kv/txn", grant(i, lease, True)),
        }  # fmt: skip
        grpc, client = await grpc_requests(host, int(port))
        kinds.update(grpc)
        await asyncio.sleep(1.0)  # the watchers are up
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        for i in range(args.count):
            for kind, send in kinds.items():
                await asyncio.sleep(args.gap)
                start = time.perf_counter()
                await send(i)
                times[kind].append(time.perf_counter() - start)
        if client is not None:
            await client.close()
    return {kind: {f"p{q}": round(percentile(t, q) * 1e3, 2) for q in (50, 90)}
            for kind, t in times.items()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.etcd_request_cost")
    parser.add_argument("--gap", type=float, default=0.4, help="idle seconds before each request")
    parser.add_argument("--count", type=int, default=25, help="requests of each kind")
    parser.add_argument("--watchers", type=int, default=4)
    print(json.dumps(uvloop.run(measure(parser.parse_args()))))


if __name__ == "__main__":
    main()
