"""`GET /leader` throughput and latency over the Unix socket, as a ratio to bare aiohttp.

One daemon (default timing) and bench/floor_server.py, a bare aiohttp ``web.Application``
on uvloop answering the daemon's own /leader body, both running through the whole family.
For each concurrency level, load-generator processes (bench/loadgen.py) open that many
keep-alive connections to each server and keep one server's connections busy per window
(one request in flight each), alternating servers ABBA on a schedule the processes share.
Each daemon window is paired with the floor window beside it; the figure judged is the
median of the pairs' throughput ratios (bench/ratios.py): at least 0.9, aiohttp being the
chosen server. A warm-up window on each server comes first and is not counted.

The servers' CPU is read at each window's edges, and the daemon's backend request count
before and after each level: the API must not query the backend per request
(docs/architecture.md), so the count may only grow by the renewals that fall in the level.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from . import floor_server
from .common import (
    DEFAULT_TIMING,
    Figure,
    Served,
    cluster,
    cpu_seconds,
    loadgens,
    percentile,
    split,
)
from .ratios import Paired, alternate
from .unix_http import backend_requests, request

MIN_RATIO = 0.9  # of a bare aiohttp Application's req/s, measured in the same run
GAP = 0.1  # seconds between two windows: the last answers drain, the CPU is read
WARMUP = [0, 1]  # one window on each server first, not counted


def schedule(rounds: int) -> list[int]:
    """Server per window (0 leaderd, 1 aiohttp): the warm-up, then ABBA pairs."""
    order = list(WARMUP)
    for leaderd_first in alternate(rounds):
        order += [0, 1] if leaderd_first else [1, 0]
    return order


async def one_level(
    servers: tuple[Served, Served], connections: int, processes: int, window: float, rounds: int
) -> dict[str, Any]:
    """``rounds`` windows on each server, alternating, with the same client processes."""
    order = schedule(rounds)
    args = ["leader", "--window", str(window), "--gap", str(GAP), "--latencies",
            "--order", ",".join(map(str, order))]  # fmt: skip
    args += [arg for server in servers for arg in ("--socket", server.socket)]
    argvs = [[*args, "--connections", str(n)] for n in split(connections, processes)]
    daemon = servers[0]
    async with loadgens(argvs) as procs:
        for proc in procs:
            await proc.line(60)  # {"connected": true}
        queries0 = await backend_requests(daemon.socket)
        start_at = time.monotonic() + 0.05
        for proc in procs:
            await proc.tell(start_at)
        cpu = await _server_cpu(servers, order, start_at, window)
        results = [await proc.line(len(order) * (window + GAP) + 60) for proc in procs]
        queries1 = await backend_requests(daemon.socket)
    windows = [_window(i, [r["windows"][i] for r in results], cpu[i]) for i in range(len(order))]
    counted = windows[len(WARMUP) :]
    ours = [w for w in counted if w["server"] == 0]
    peer = [w for w in counted if w["server"] == 1]
    return {
        "connections": connections,
        "client_processes": len(procs),
        "leaderd": ours,
        "aiohttp": peer,
        "warmup": windows[: len(WARMUP)],
        "client_cpu": [r["cpu_seconds"] for r in results],
        "seconds": len(order) * (window + GAP),
        # /metrics itself is not a backend request; renewals are (one per renew_interval).
        "backend_requests": queries1["total"] - queries0["total"],
    }


async def _server_cpu(
    servers: tuple[Served, Served], order: list[int], start_at: float, window: float
) -> list[float]:
    """CPU seconds of the busy server in each window, read at the window's edges."""
    used = []
    for i, which in enumerate(order):
        begin = start_at + i * (window + GAP)
        await asyncio.sleep(max(0.0, begin - time.monotonic()))
        before = cpu_seconds(servers[which].pid)
        await asyncio.sleep(max(0.0, begin + window + GAP / 2 - time.monotonic()))
        used.append(cpu_seconds(servers[which].pid) - before)
    return used


def _window(index: int, parts: list[dict[str, Any]], cpu: float) -> dict[str, Any]:
    """One window of every client process, summed."""
    requests = sum(p["requests"] for p in parts)
    first = min(p["first_sent"] for p in parts)
    last = max(p.get("last_answer", p["first_sent"]) for p in parts)
    seconds = max(last - first, 1e-9)
    latencies = [x / 1e6 for p in parts for x in p.get("latencies_us", [])]
    statuses: dict[str, int] = {}
    for p in parts:
        for code, n in p["statuses"].items():
            statuses[code] = statuses.get(code, 0) + n
    return {
        "window": index,
        "server": parts[0]["socket"],
        "requests": requests,
        "seconds": seconds,
        "rps": requests / seconds,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "statuses": statuses,
        "server_cpu": cpu / seconds,
        "cpu_us_per_request": cpu / requests * 1e6 if requests else float("nan"),
    }


async def measure(
    url: str, levels: list[int], window: float, processes: int, rounds: int = 10
) -> tuple[list[Figure], dict[str, Any]]:
    rows = []
    async with cluster(url, 1, DEFAULT_TIMING, "ld") as group:
        daemon = group.daemons[0]
        await group.settled()
        body = (await request(daemon.socket, "/leader")).body
        async with floor_server.running(body) as floor:
            for connections in levels:
                row = await one_level((daemon, floor), connections, processes, window, rounds)
                rows.append(row)
    figures = [_level_figure(row) for row in rows]
    total_requests = sum(w["requests"] for row in rows for w in row["leaderd"])
    total_queries = sum(row["backend_requests"] for row in rows)
    renewals_allowed = all(
        row["backend_requests"] <= row["seconds"] / DEFAULT_TIMING.renew_interval + 1
        for row in rows
    )
    figures.append(
        Figure(
            "leader",
            "any",
            "backend queries per /leader request",
            total_queries / total_requests if total_requests else float("nan"),
            "",
            "0 (renewals only)",
            renewals_allowed,
            note=f"{total_queries:g} backend requests (renewals) during {total_requests:,} GETs",
        )
    )
    data = {
        "levels": rows,
        "rounds": rounds,
        "window": window,
        "body_bytes": len(body),
        "timing": dataclasses.asdict(DEFAULT_TIMING),
    }
    return figures, data


def _level_figure(row: dict[str, Any]) -> Figure:
    ours, peer = row["leaderd"], row["aiohttp"]
    paired = Paired(tuple(w["rps"] for w in ours), tuple(w["rps"] for w in peer))
    ratio = paired.median
    cpu = Paired(
        tuple(w["cpu_us_per_request"] for w in peer), tuple(w["cpu_us_per_request"] for w in ours)
    )
    return Figure(
        "leader",
        "any",
        f"/leader {row['connections']} conns: req/s vs aiohttp",
        ratio,
        "x",
        f">= {MIN_RATIO:g}x",
        None if ratio is None else ratio >= MIN_RATIO,
        note=(
            f"median of {len(ours)} pairs, {min(paired.ratios):.2f}-{max(paired.ratios):.2f}x; "
            f"leaderd/aiohttp req/s p50 {_p50(ours, 'rps'):,.0f}/{_p50(peer, 'rps'):,.0f}, "
            f"latency p99 {_p50(ours, 'p99') * 1e3:.2f}/{_p50(peer, 'p99') * 1e3:.2f} ms, "
            f"CPU per request {_p50(ours, 'cpu_us_per_request'):.0f}/"
            f"{_p50(peer, 'cpu_us_per_request'):.0f} us (efficiency {cpu.median or 0:.2f}x)"
        ),
    )


def _p50(windows: list[dict[str, Any]], key: str) -> float:
    return percentile([w[key] for w in windows], 50)
