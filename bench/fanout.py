"""`/watch` fan-out and the daemon's memory.

One daemon (default timing). N long polls are opened by a load-generator process
(bench/loadgen.py) and counted through `leaderd_watchers`; then `POST /resign` changes
the election. The figure is the time from just before the resign is sent until the
last of the N answers has arrived at the client (one monotonic clock for both
processes). RSS (VmRSS) is read idle, after a settle, and with the largest number of
watchers connected. The bench raises RLIMIT_NOFILE to the hard limit; the daemon inherits
it (leaderd does not raise its own, see docs/benchmarks.md). The same trials then run
against bench/floor_server.py, a bare aiohttp long poll: the floor this machine and aiohttp
set, and what leaderd's own code adds to it.
"""

from __future__ import annotations

import asyncio
import resource
import time
from typing import Any

from . import floor_server
from .common import (
    DEFAULT_TIMING,
    Figure,
    Served,
    cluster,
    cpu_seconds,
    get_json,
    judge,
    loadgens,
    memory_mb,
    metric_sums,
    ms,
    raise_nofile,
    request,
    split,
    until,
)

TARGETS = {1000: 0.030, 10000: 0.200}  # issue 12
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
    """``settle``: seconds between ready and the idle RSS reading."""
    limit = raise_nofile(resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    figures: list[Figure] = []
    data: dict[str, Any] = {"nofile_soft_limit_bench": limit, "sizes": {}}
    async with cluster(url, 1, DEFAULT_TIMING, "fo") as group:
        daemon = group.daemons[0]
        await group.settled()
        await asyncio.sleep(settle)
        data["idle_memory_mb"] = mem = memory_mb(daemon.pid)
        idle = mem["rss"]
        data["nofile_soft_limit_daemon"] = daemon_limit = nofile_limit(daemon.pid)
        figures.append(
            Figure(
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
        )
        for size in sizes:
            if size + 64 > daemon_limit:
                figures.append(
                    Figure(
                        "watch",
                        "any",
                        f"/watch fan-out {size:,}",
                        None,
                        "ms",
                        note=f"skipped: open-file limit {daemon_limit} < {size} + 64",
                    )
                )
                continue
            runs = []
            for _ in range(trials):
                runs.append(await one_trial(daemon, size, processes))
                await group.settled()
            data["sizes"][size] = runs
            figures += _figures(size, runs)
    measured = [size for size in sizes if size in data["sizes"]]
    data["floor"] = floors = {}
    async with floor_server.running() as floor:
        for size in measured:
            floors[size] = [await one_trial(floor, size, processes) for _ in range(trials)]
            figures.append(_floor_figure(size, floors[size], data["sizes"][size]))
    return figures, data


def _floor_figure(size: int, floors: list[dict[str, Any]], runs: list[dict[str, Any]]) -> Figure:
    """The bare aiohttp long poll's worst, and what leaderd adds to it."""
    worst, ours = _worst(floors), _worst(runs)
    added = f"; leaderd adds {ms(ours - worst):.0f} ms" if worst and ours else ""
    cpu = max(r["daemon_cpu_seconds"] for r in floors)
    return Figure(
        "watch",
        "aiohttp",
        f"floor: {size:,} bare aiohttp long polls",
        ms(worst) if worst is not None else None,
        "ms",
        note=f"worst of {len(floors)}; server CPU <= {ms(cpu):.0f} ms{added}",
    )


def _worst(runs: list[dict[str, Any]]) -> float | None:
    """The slowest trial's time until all were answered; None if one was not complete."""
    times = [r["all_answered"] for r in runs]
    return max(times) if times and None not in times else None


def _figures(size: int, runs: list[dict[str, Any]]) -> list[Figure]:
    complete = [r["all_answered"] for r in runs if r["all_answered"] is not None]
    worst = _worst(runs)
    target = TARGETS.get(size)
    cpu = max(max(r["client_cpu_seconds"]) for r in runs)
    figures = [
        Figure(
            "watch",
            "any",
            f"/watch fan-out {size:,}: all answered",
            ms(worst) if worst is not None else None,
            "ms",
            f"<= {ms(target):g} ms" if target else "",
            judge(worst, target) if target and worst is not None else (False if target else None),
            note=(
                f"worst of {len(runs)} (all: {', '.join(f'{ms(t):.0f}' for t in complete)} ms); "
                f"first answer {ms(min(r['first_answered'] for r in runs)):.1f} ms; "
                f"client CPU <= {ms(cpu):.0f} ms"
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
