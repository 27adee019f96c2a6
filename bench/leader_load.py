"""`GET /leader` throughput and latency over the Unix socket, as a ratio to bare aiohttp.

One daemon (default timing) and bench/floor_server.py, a bare aiohttp ``web.Application``
on uvloop answering the daemon's own /leader body, both running through the whole family.
For each concurrency level, load-generator processes (bench/loadgen.py) keep that many
keep-alive connections busy, one request in flight each, against the daemon and then the
floor (or the floor first: the order alternates), ``rounds`` times. Each daemon window is
paired with the floor window beside it; the figure judged is the median of the pairs'
throughput ratios (bench/ratios.py): at least 0.9, aiohttp being the chosen server.

The daemon's CPU and its backend request count are read before and after each window:
the API must not query the backend per request (docs/architecture.md), so the count may
only grow by the renewals that fall in the window.
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
    request,
    split,
)
from .ratios import Paired, alternate

MIN_RATIO = 0.9  # of a bare aiohttp Application's req/s, measured in the same run


async def one_window(
    server: Served, connections: int, processes: int, duration: float, daemon: bool
) -> dict[str, Any]:
    args = ["leader", "--socket", server.socket, "--duration", str(duration)]
    argvs = [[*args, "--connections", str(n)] for n in split(connections, processes)]
    async with loadgens(argvs) as procs:
        for proc in procs:
            await proc.line(30)  # {"recording": true}: the warm-up is over
        cpu0 = cpu_seconds(server.pid)
        queries0 = await backend_requests(server.socket) if daemon else {"total": 0.0}
        results = [await proc.line(duration + 30) for proc in procs]
        cpu1 = cpu_seconds(server.pid)
        queries1 = await backend_requests(server.socket) if daemon else {"total": 0.0}
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
        "server_cpu": (cpu1 - cpu0) / seconds,
        "client_cpu": [r["cpu_seconds"] / r["seconds"] for r in results],
        # /metrics itself is not a backend request; renewals are (one per renew_interval).
        "backend_requests": queries1["total"] - queries0["total"],
    }


async def one_level(
    daemon: Served, floor: Served, connections: int, processes: int, duration: float, rounds: int
) -> dict[str, Any]:
    """``rounds`` daemon windows and as many floor windows, alternating."""
    ours: list[dict[str, Any]] = []
    peer: list[dict[str, Any]] = []
    for daemon_first in alternate(rounds):
        order = [(daemon, True), (floor, False)]
        for server, is_daemon in order if daemon_first else order[::-1]:
            row = await one_window(server, connections, processes, duration, is_daemon)
            (ours if is_daemon else peer).append(row)
    return {"connections": connections, "leaderd": ours, "aiohttp": peer}


async def measure(
    url: str, levels: list[int], duration: float, processes: int, rounds: int = 3
) -> tuple[list[Figure], dict[str, Any]]:
    rows = []
    async with cluster(url, 1, DEFAULT_TIMING, "ld") as group:
        daemon = group.daemons[0]
        await group.settled()
        body = (await request(daemon.socket, "/leader")).body
        async with floor_server.running(body) as floor:
            for connections in levels:
                rows.append(
                    await one_level(daemon, floor, connections, processes, duration, rounds)
                )
    figures = [_level_figure(row) for row in rows]
    windows = [w for row in rows for w in row["leaderd"]]
    renewals = duration / DEFAULT_TIMING.renew_interval + 1
    total_requests = sum(w["requests"] for w in windows)
    total_queries = sum(w["backend_requests"] for w in windows)
    figures.append(
        Figure(
            "leader",
            "any",
            "backend queries per /leader request",
            total_queries / total_requests if total_requests else float("nan"),
            "",
            "0 (renewals only)",
            all(w["backend_requests"] <= renewals for w in windows),
            note=f"{total_queries:g} backend requests (renewals) during {total_requests:,} GETs",
        )
    )
    data = {
        "levels": rows,
        "rounds": rounds,
        "body_bytes": len(body),
        "timing": dataclasses.asdict(DEFAULT_TIMING),
    }
    return figures, data


def _level_figure(row: dict[str, Any]) -> Figure:
    ours, peer = row["leaderd"], row["aiohttp"]
    paired = Paired(tuple(w["rps"] for w in ours), tuple(w["rps"] for w in peer))
    ratio = paired.median
    return Figure(
        "leader",
        "any",
        f"/leader {row['connections']} conns: req/s vs aiohttp",
        ratio,
        "x",
        f">= {MIN_RATIO:g}x",
        None if ratio is None else ratio >= MIN_RATIO,
        note=(
            f"median of {len(ours)}; {paired.describe('req/s')}; "
            f"p99 {_p99s(ours)} / {_p99s(peer)} ms; "
            f"CPU {_cpu(ours)} / {_cpu(peer)}"
        ),
    )


def _p99s(windows: list[dict[str, Any]]) -> str:
    return ",".join(f"{w['p99'] * 1e3:.1f}" for w in windows)


def _cpu(windows: list[dict[str, Any]]) -> str:
    return ",".join(f"{w['server_cpu'] * 100:.0f}%" for w in windows)
