"""`/watch` fan-out and the daemon's memory.

One daemon (default timing). N long polls are opened by a load-generator process
(bench/loadgen.py) and counted through `leaderd_watchers`; then `POST /resign` changes
the election. The figure is the time from just before the resign is sent until the
last of the N answers has arrived at the client (one monotonic clock for both
processes). RSS (VmRSS) is read idle, after a settle, and with the largest number of
watchers connected. The bench raises RLIMIT_NOFILE to the hard limit; the daemon inherits
it (leaderd does not raise its own, see docs/benchmarks.md). Each trial is paired with one
against bench/floor_server.py, a bare aiohttp ``web.Application`` whose long polls wait for
one future, running beside the daemon, in alternating order; the figure judged is the
median of the pairs' ratios (bench/ratios.py): within 1.2x of aiohttp's own time.
"""

from __future__ import annotations

import asyncio
import resource
import time
from typing import Any

from . import floor_server
from .common import (
    DEFAULT_TIMING,
    Cluster,
    Figure,
    Served,
    cluster,
    cpu_seconds,
    judge,
    loadgens,
    memory_mb,
    ms,
    raise_nofile,
    split,
    until,
)
from .ratios import Paired, alternate
from .unix_http import get_json, metric_sums, request

MAX_RATIO = 1.2  # of a bare aiohttp long poll's time, measured in the same run
IDLE_RSS_MB = 40.0


def nofile_limit(pid: int) -> int:
    """The soft 'Max open files' of a running process."""
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise RuntimeError(f"no open-file limit for {pid}")


async def one_trial(daemon: Served, clients: int, processes: int) -> dict[str, Any]:
    """Open ``clients`` long polls, resign, time the answers; the leader is back after."""
    status = await get_json(daemon.socket, "/leader")
    args = ["watch", "--socket", daemon.socket, "--revision", str(status["revision"])]
    argvs = [[*args, "--clients", str(n)] for n in split(clients, processes)]
    async with loadgens(argvs) as procs:
        for proc in procs:
            await proc.line(120)  # {"ready": n}: every connection is open
        await until(
            f"{clients} watchers",
            60,
            lambda: _watchers_at_least(daemon, clients),
        )
        memory = memory_mb(daemon.pid)
        cpu0 = cpu_seconds(daemon.pid)
        t0 = time.monotonic()
        resign = await request(daemon.socket, "/resign?cooldown=0", method="POST")
        results = [await proc.line(60) for proc in procs]
        cpu = cpu_seconds(daemon.pid) - cpu0
    answered = sum(r["answered"] for r in results)
    last = max((r["last"] for r in results if r["last"] is not None), default=None)
    first = min((r["first"] for r in results if r["first"] is not None), default=None)
    return {
        "clients": clients,
        "client_processes": processes,
        "answered": answered,
        "statuses": [r["statuses"] for r in results],
        "all_answered": (last - t0) if last is not None and answered == clients else None,
        "first_answered": (first - t0) if first is not None else None,
        "resign_answered": resign.at - t0,
        "rss_mb": memory["rss"],
        "memory_mb": memory,
        "daemon_cpu_seconds": cpu,
        "client_cpu_seconds": [r["cpu_seconds"] for r in results],
    }


async def _watchers_at_least(daemon: Served, n: int) -> bool:
    return (await metric_sums(daemon.socket)).get("leaderd_watchers", 0) >= n


async def measure(
    url: str, sizes: list[int], trials: int, processes: int, settle: float = 3.0
) -> tuple[list[Figure], dict[str, Any]]:
    """``settle``: seconds between ready and the idle RSS reading. ``trials`` pairs per
    size: a daemon trial and a floor trial, alternating which goes first."""
    limit = raise_nofile(resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    figures: list[Figure] = []
    data: dict[str, Any] = {"nofile_soft_limit_bench": limit, "sizes": {}, "floor": {}}
    async with cluster(url, 1, DEFAULT_TIMING, "fo") as group:
        daemon = group.daemons[0]
        await group.settled()
        await asyncio.sleep(settle)
        data["idle_memory_mb"] = mem = memory_mb(daemon.pid)
        data["nofile_soft_limit_daemon"] = daemon_limit = nofile_limit(daemon.pid)
        figures.append(_idle_figure(mem, settle))
        body = (await request(daemon.socket, "/leader")).body
        async with floor_server.running(body) as floor:
            for size in sizes:
                if size + 64 > daemon_limit:
                    note = f"skipped: open-file limit {daemon_limit} < {size} + 64"
                    figures.append(Figure("watch", "any", f"/watch fan-out {size:,}", None,
                                          "x", note=note))  # fmt: skip
                    continue
                runs, floors = await _pairs(group, floor, size, trials, processes)
                data["sizes"][size], data["floor"][size] = runs, floors
                figures += _figures(size, runs, floors)
    return figures, data


async def _pairs(
    group: Cluster, floor: Served, size: int, trials: int, processes: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``trials`` trials on the daemon and as many on the floor, alternating."""
    daemon = group.daemons[0]
    runs: list[dict[str, Any]] = []
    floors: list[dict[str, Any]] = []
    for daemon_first in alternate(trials):
        for on_daemon in (True, False) if daemon_first else (False, True):
            if on_daemon:
                runs.append(await one_trial(daemon, size, processes))
                await group.settled()  # the leader is back before the next trial
            else:
                floors.append(await one_trial(floor, size, processes))
    return runs, floors


def _idle_figure(mem: dict[str, float], settle: float) -> Figure:
    idle = mem["rss"]
    return Figure(
        "rss",
        "sqlite",
        "RSS idle",
        idle,
        "MB",
        f"<= {IDLE_RSS_MB:g} MB",
        judge(idle, IDLE_RSS_MB),
        note=(
            f"VmRSS {settle:g} s after ready; private (RssAnon) {mem.get('anon', 0):.1f}"
            f" MB, shared files {mem.get('file', 0):.1f} MB, PSS {mem.get('pss', 0):.1f} MB"
        ),
    )


def _figures(size: int, runs: list[dict[str, Any]], floors: list[dict[str, Any]]) -> list[Figure]:
    complete = all(r["all_answered"] is not None for r in runs + floors)
    paired = Paired(
        tuple(r["all_answered"] or 0.0 for r in runs),
        tuple(r["all_answered"] or 0.0 for r in floors),
    )
    ratio = paired.median if complete else None
    cpu = max(max(r["client_cpu_seconds"]) for r in runs + floors)
    slowest = f"{ms(max(paired.ours)):.0f} / {ms(max(paired.peer)):.0f} ms"
    figures = [
        Figure(
            "watch",
            "any",
            f"/watch fan-out {size:,}: all answered vs aiohttp",
            ratio,
            "x",
            f"<= {MAX_RATIO:g}x",
            None if ratio is None else ratio <= MAX_RATIO,
            note=(
                f"median of {len(runs)}; slowest {slowest}; {paired.describe('ms', 1e3)}; "
                f"server CPU {_cpu(runs)} / {_cpu(floors)} ms; client CPU <= {ms(cpu):.0f} ms"
                + ("" if complete else "; a trial was not answered in full")
            ),
        )
    ]
    top = max(runs, key=lambda r: r["rss_mb"])
    anon = top["memory_mb"].get("anon", 0.0)
    note = f"private (RssAnon) {anon:.1f} MB"
    figures.append(
        Figure("rss", "sqlite", f"RSS with {size:,} watchers", top["rss_mb"], "MB", note=note)
    )
    return figures


def _cpu(runs: list[dict[str, Any]]) -> str:
    return ",".join(f"{ms(r['daemon_cpu_seconds']):.0f}" for r in runs)
