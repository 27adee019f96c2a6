"""python -m bench: measure leaderd against its targets and print one table.

    python -m bench                          # everything, about 8 minutes on 2 cores
    python -m bench --only handover,etcd --backends postgresql --handovers 50
    python -m bench --only handover --backends sqlite,postgresql,postgresql+advisory,etcd

Writes every figure and raw sample to bench/results/latest.json (git-ignored).
Exit code 1 if a measurement could not be made (not when a target is missed).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import functools
import os
import platform
import resource
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from . import etcd, fanout, handover, leader_load, qps, startup
from .common import BACKENDS, Backends, Figure, backends, raise_nofile

FAMILIES = ("handover", "failover", "leader", "watch", "rss", "qps", "etcd")
Measured = tuple[list[Figure], Any]
RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _names(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        unknown = sorted(set(names) - set(allowed))
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {allowed}")
        return names

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument(
        "--only",
        type=_names(FAMILIES),
        default=list(FAMILIES),
        metavar="LIST",
        help=f"families to run (default all): {','.join(FAMILIES)}",
    )
    p.add_argument(
        "--backends",
        type=_names((*BACKENDS, "etcd")),
        default=list(BACKENDS),
        metavar="LIST",
        help=f"backends for handover, failover and qps: {','.join(BACKENDS)}; etcd: "
        "leaderd's handover on the etcd cluster of etcdctl's reference",
    )
    # 100: with 30, "p99" is the slowest sample but one, one stray scheduling delay.
    p.add_argument("--handovers", type=int, default=100, help="graceful handovers per backend")
    p.add_argument("--failovers", type=int, default=15, help="crash failovers per backend")
    p.add_argument(
        "--leader-connections",
        type=_ints,
        default=[1, 8, 32],
        metavar="LIST",
        help="concurrency levels for /leader (default 1,8,32)",
    )
    p.add_argument("--leader-duration", type=float, default=1.0, help="seconds per /leader window")
    p.add_argument(
        "--leader-rounds",
        type=int,
        default=20,  # single windows vary by a third on a shared VM: the median needs pairs
        help="/leader windows per level on leaderd, and as many on bare aiohttp, alternating",
    )
    p.add_argument(
        "--client-processes", type=int, default=2, help="load-generator processes for /leader"
    )
    p.add_argument(
        "--watchers",
        type=_ints,
        default=[1000, 10000],
        metavar="LIST",
        help="fan-out sizes (default 1000,10000)",
    )
    p.add_argument(
        "--watch-trials",
        type=int,
        default=15,  # medians of 7 pairs moved by up to 0.6x between runs on a shared VM
        help="fan-out trials per size on leaderd, and as many on bare aiohttp, alternating",
    )
    p.add_argument("--watch-processes", type=int, default=1, help="watch client processes")
    p.add_argument(
        "--rss-settle", type=float, default=3.0, help="seconds idle before the idle RSS reading"
    )
    p.add_argument("--startup-runs", type=int, default=5, help="daemon starts timed, per kind")
    p.add_argument("--qps-window", type=float, default=30.0, help="steady-state window, s")
    p.add_argument("--qps-warmup", type=float, default=5.0, help="warm-up before it, s")
    p.add_argument("--etcd-handovers", type=int, help="default: --handovers")
    p.add_argument("--etcd-failovers", type=int, help="default: --failovers")
    p.add_argument(
        "--etcd-fsync",
        action="store_true",
        help="let etcd fsync (default off, like the bench's PostgreSQL)",
    )
    p.add_argument("--json", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    return p.parse_args(argv)  # fmt: skip


def machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
        "git": _out(["git", "rev-parse", "--short", "HEAD"]),
        "etcd": _out(["etcd", "--version"]).split("\n")[0],
    }


def _out(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.figures: list[Figure] = []
        self.data: dict[str, Any] = {}
        self.failed: list[str] = []

    async def step(self, label: str, work: Callable[[], Awaitable[Measured]]) -> None:
        print(f"# {label} ...", file=sys.stderr, flush=True)
        start = time.monotonic()
        try:
            figures, data = await work()
        except Exception as exc:  # one broken measurement must not hide the others
            traceback.print_exc()
            self.failed.append(label)
            family, _, backend = label.partition(" ")
            figures, data = [Figure(family, backend, "error", None, "", note=repr(exc))], None
        self.figures += figures
        self.data[label] = data
        for f in figures:
            print(f"#   {f.name}: {f.cell()} {f.verdict()}", file=sys.stderr, flush=True)
        print(f"# {label}: {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)

    async def run(self, group: Backends) -> None:
        a, only = self.args, set(self.args.only)
        for name, reason in group.skipped.items():
            self.figures.append(Figure("skip", name, "skipped", None, "", note=reason))
        first = group.available[0] if group.available else "sqlite"
        if "leader" in only:
            await self.step(
                "leader",
                lambda: leader_load.measure(
                    group.url(first),
                    a.leader_connections,
                    a.leader_duration,
                    a.client_processes,
                    a.leader_rounds,
                ),
            )
        if only & {"watch", "rss"}:
            sizes = a.watchers if "watch" in only else [max(a.watchers)]
            await self.step(
                "watch",
                lambda: fanout.measure(
                    group.url(first), sizes, a.watch_trials, a.watch_processes, a.rss_settle
                ),
            )
            keep = {"watch", "rss"} & only
            self.figures = [f for f in self.figures if f.family not in {"watch", "rss"} - keep]
        if "rss" in only:
            await self.step("startup", lambda: startup.measure(a.startup_runs))
        if "handover" in only and not etcd.missing() and "etcd" not in only:
            with_etcd = "etcd" in a.backends
            work = functools.partial(etcd.reference, a.handovers, a.etcd_fsync, with_etcd)
            await self.step(etcd.REFERENCE, work)
        for name in group.available:
            if "handover" in only and name != handover.IMMEDIATE:  # same path as the default
                work = functools.partial(handover.handover, name, group.url(name), a.handovers)
                await self.step(f"handover {name}", work)
            if "failover" in only:
                work = functools.partial(handover.failover, name, group.url(name), a.failovers)
                await self.step(f"failover {name}", work)
        if "qps" in only and group.available:
            await self.step(
                "qps", lambda: qps.measure(group, group.available, a.qps_warmup, a.qps_window)
            )
        if "etcd" in only:
            absent = etcd.missing()
            if absent:
                self.figures.append(Figure("etcd", "etcd", "skipped", None, "", note=absent))
            else:
                counts = (a.etcd_handovers or a.handovers, a.etcd_failovers or a.failovers)
                await self.step(
                    "etcd",
                    lambda: etcd.measure(*counts, a.etcd_fsync, a.qps_window, a.rss_settle),
                )


def table(figures: list[Figure]) -> str:
    rows = [("family", "backend", "figure", "value", "target", "", "notes")]
    rows += [
        (f.family, f.backend, f.name, f.cell(), f.target, f.verdict(), f.note) for f in figures
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = []
    for i, row in enumerate(rows):
        cells = [row[j].ljust(widths[j]) if j != 3 else row[j].rjust(widths[j]) for j in range(6)]
        lines.append("  ".join([*cells, row[6]]).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  -----")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_nofile(resource.getrlimit(resource.RLIMIT_NOFILE)[1])  # daemons inherit it
    started = dt.datetime.now(dt.UTC)
    info = machine()
    bench = Bench(args)
    t0 = time.monotonic()
    wanted = args.backends if {"handover", "failover", "qps"} & set(args.only) else ["sqlite"]
    with backends(wanted) as group:
        try:
            import uvloop

            uvloop.run(bench.run(group))
        except ImportError:
            asyncio.run(bench.run(group))
    bench.figures += etcd.ratios(bench.data)
    info["load_average_end"] = os.getloadavg()
    elapsed = time.monotonic() - t0
    print(table(bench.figures))
    met = sum(f.met is True for f in bench.figures)
    missed = [f"{f.backend} {f.name}" for f in bench.figures if f.met is False]
    print(f"\n{met} targets met, {len(missed)} missed; {elapsed:.0f} s; {info['cpus']} CPUs, "
          f"load average {info['load_average'][0]:.2f} at start, "
          f"{info['load_average_end'][0]:.2f} at end")  # fmt: skip
    if bench.failed:
        print(f"measurements that failed: {', '.join(bench.failed)}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "command": " ".join(["python -m bench", *(sys.argv[1:] if argv is None else argv)]),
        "started": started.isoformat(timespec="seconds"),
        "seconds": elapsed,
        "machine": info,
        "figures": [dataclasses.asdict(f) for f in bench.figures],
        "data": bench.data,
        "failed": bench.failed,
    }
    args.json.write_bytes(
        orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    )
    print(f"results: {args.json}")
    return 1 if bench.failed else 0


if __name__ == "__main__":
    sys.exit(main())
