"""`GET /leader` throughput and latency over the Unix socket.

One daemon (default timing). For each concurrency level, load-generator processes
(bench/loadgen.py) keep that many keep-alive connections busy, one request in flight
each. The daemon's CPU and its backend request count are read before and after the
measured window: the API must not query the backend per request (docs/architecture.md), so the
count may only grow by the renewals that fall in the window. The highest level then runs
against bench/floor_server.py, a bare aiohttp answer of the same size: the floor this
machine and aiohttp set.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import floor_server
from .common import (
    DEFAULT_TIMING,
    Figure,
    Served,
    backend_requests,
    cluster,
    cpu_seconds,
    loadgens,
    percentile,
    split,
)

MIN_RPS = 30000.0  # issue 12: on one core (the daemon is one thread)
MAX_P99 = 0.002


async def one_level(
    daemon: Served, connections: int, processes: int, duration: float
) -> dict[str, Any]:
    args = ["leader", "--socket", daemon.socket, "--duration", str(duration)]
    argvs = [[*args, "--connections", str(n)] for n in split(connections, processes)]
    async with loadgens(argvs) as procs:
        for proc in procs:
            await proc.line(30)  # {"recording": true}: the warm-up is over
        cpu0, queries0 = cpu_seconds(daemon.pid), await backend_requests(daemon.socket)
        results = [await proc.line(duration + 30) for proc in procs]
        cpu1, queries1 = cpu_seconds(daemon.pid), await backend_requests(daemon.socket)
    latencies = [x / 1e6 for r in results for x in r["latencies_us"]]
    seconds = max(r["seconds"] for r in results)
    statuses: dict[str, int] = {}
    for r in results:
        for code, n in r["statuses"].items():
            statuses[code] = statuses.get(code, 0) + n
    return {
        "connections": connections,
        "client_processes": len(procs),
        "requests": len(latencies),
        "rps": len(latencies) / seconds,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "max": max(latencies, default=float("nan")),
        "statuses": statuses,
        "seconds": seconds,
        "daemon_cpu": (cpu1 - cpu0) / seconds,
        "client_cpu": [r["cpu_seconds"] / r["seconds"] for r in results],
        # /metrics itself is not a backend request; renewals are (one per renew_interval).
        "backend_requests": queries1["total"] - queries0["total"],
    }


async def measure(
    url: str, levels: list[int], duration: float, processes: int
) -> tuple[list[Figure], dict[str, Any]]:
    rows = []
    async with cluster(url, 1, DEFAULT_TIMING, "ld") as group:
        daemon = group.daemons[0]
        await group.settled()
        for connections in levels:
            rows.append(await one_level(daemon, connections, processes, duration))
    async with floor_server.running() as floor:
        top = max(levels)
        floor_row = await one_level(floor, top, processes, duration)
    figures = []
    renewals = duration / DEFAULT_TIMING.renew_interval + 1
    for row in rows:
        client = "+".join(f"{c * 100:.0f}%" for c in row["client_cpu"])
        met = row["rps"] >= MIN_RPS and row["p99"] < MAX_P99
        figures.append(
            Figure(
                "leader",
                "any",
                f"/leader {row['connections']} conns: req/s",
                row["rps"],
                "req/s",
                f">= {MIN_RPS:,.0f} & p99 < {MAX_P99 * 1e3:g} ms",
                met,
                note=(
                    f"p50 {row['p50'] * 1e3:.2f} ms, p99 {row['p99'] * 1e3:.2f} ms; "
                    f"CPU daemon {row['daemon_cpu'] * 100:.0f}%, clients {client}"
                ),
            )
        )
    total_requests = sum(r["requests"] for r in rows)
    total_queries = sum(r["backend_requests"] for r in rows)
    figures.append(
        Figure(
            "leader",
            "any",
            "backend queries per /leader request",
            total_queries / total_requests if total_requests else float("nan"),
            "",
            "0 (renewals only)",
            all(r["backend_requests"] <= renewals for r in rows),
            note=f"{total_queries:g} backend requests (renewals) during {total_requests:,} GETs",
        )
    )
    figures.append(_floor_figure(floor_row))
    data = {"levels": rows, "floor": floor_row, "timing": dataclasses.asdict(DEFAULT_TIMING)}
    return figures, data


def _floor_figure(row: dict[str, Any]) -> Figure:
    return Figure(
        "leader",
        "aiohttp",
        f"floor: bare aiohttp at {row['connections']} conns",
        row["rps"],
        "req/s",
        note=(
            f"p50 {row['p50'] * 1e3:.2f} ms, p99 {row['p99'] * 1e3:.2f} ms; "
            f"CPU server {row['daemon_cpu'] * 100:.0f}%"
        ),
    )
