"""Start-up: from the daemon's process start to its READY=1 on SQLite (issue 12's figure).

The daemon is spawned with NOTIFY_SOCKET naming a datagram socket the bench binds, as
systemd's Type=notify does; each run times the spawn to the READY=1 datagram on a fresh
SQLite file, so the figure includes the interpreter, the imports, the first round and the
socket: everything a restart under systemd waits for.

The judged figure runs the daemon as a user's install does: a virtual environment whose
path holds leaderd and its dependencies as plain directories. The development venv's
editable install adds an import hook that every interpreter start loads (about 25 ms on
the bench VM); that figure is printed too. So is the floor: an interpreter that only
imports what any aiohttp daemon imports (asyncio, ssl, aiohttp.web, uvloop) and exits.

Each started daemon is then stopped the way systemd stops it (SIGTERM, as the leader of its
SQLite file): the figures are the time from the signal to the process's end, and the CPU it
spent meanwhile (the release, the orderly stop, the exit), which a successor on the same
host competes with while it takes over.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import time
from typing import Any

from tests.support.daemons import REPO, Daemon, short_tempdir

from .common import DAEMON_ARGS, Figure, judge, ms, summary

STARTUP_MS = 300.0  # issue 12: process start to READY=1 on SQLite
IDLE_BEFORE_STOP = 0.3  # s after READY=1: the stop of a daemon that has settled
FLOOR = (
    "import leaderd.startup.lean_imports as lean; lean.import_aiohttp(); import aiohttp.web, uvloop"
)


def installed_python(workdir: str) -> str:
    """The interpreter of a fresh venv that sees leaderd and the dev venv's packages through
    a .pth of plain paths, as an installed copy would: no editable-install hook."""
    venv = os.path.join(workdir, "venv")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", venv], check=True)
    purelib = sysconfig.get_path("purelib", vars={"base": venv, "platbase": venv})
    with open(os.path.join(purelib, "leaderd-bench.pth"), "w") as f:
        f.write("\n".join([str(REPO), *site.getsitepackages()]) + "\n")
    return os.path.join(venv, "bin", "python")


async def one_start(workdir: str, run: int, python: str) -> tuple[float, float, float]:
    """Seconds from spawning a daemon to its READY=1; then from its SIGTERM to its exit, and
    the CPU seconds it used in between."""
    path = os.path.join(workdir, f"notify-{run}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(path)
        notify.setblocking(False)
        url = f"sqlite://{workdir}/start-{run}.db"
        daemon = Daemon(f"start-{run}", url, workdir=workdir, extra_args=DAEMON_ARGS,
                        env={"NOTIFY_SOCKET": path})  # fmt: skip
        daemon.args[0] = python
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        daemon.start()
        try:
            async with asyncio.timeout(30):
                while b"READY=1" not in (await loop.sock_recv(notify, 4096)).split(b"\n"):
                    pass
            ready = time.monotonic() - t0
            await asyncio.sleep(IDLE_BEFORE_STOP)
            return (ready, *await asyncio.to_thread(_stop, daemon.pid))
        finally:
            daemon.kill()
            os.unlink(path)


def _stop(pid: int) -> tuple[float, float]:
    """SIGTERM ``pid`` (a child of ours); seconds to its exit and CPU seconds it used."""
    before = _cpu_seconds(pid)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    _, _, usage = os.wait4(pid, 0)
    return time.monotonic() - t0, usage.ru_utime + usage.ru_stime - before


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def one_floor(python: str) -> float:
    """Seconds for an interpreter to import the floor and exit."""
    t0 = time.monotonic()
    subprocess.run([python, "-c", FLOOR], check=True, cwd=REPO)
    return time.monotonic() - t0


async def measure(runs: int = 5) -> tuple[list[Figure], dict[str, Any]]:
    workdir = short_tempdir("ldb-")
    try:
        installed = installed_python(workdir)
        samples, dev, floor, stops, stop_cpu = [], [], [], [], []
        for run in range(runs):  # interleaved, so a busy moment hits all three alike
            ready, stop, cpu = await one_start(workdir, run, installed)
            samples.append(ready)
            stops.append(stop)
            stop_cpu.append(cpu)
            dev.append((await one_start(workdir, run + runs, sys.executable))[0])
            floor.append(await asyncio.to_thread(one_floor, installed))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    found, dev_found, floor_found = summary(samples), summary(dev), summary(floor)
    figure = Figure("rss", "sqlite", "start to READY=1", ms(found["p50"]), "ms",
                    f"<= {STARTUP_MS:g} ms", judge(ms(found["p50"]), STARTUP_MS),
                    note=f"p50 of {runs} starts as installed; min {ms(min(samples)):.0f} ms, "
                         f"max {ms(found['max']):.0f} ms; dev venv (editable) "
                         f"{ms(dev_found['p50']):.0f} ms")  # fmt: skip
    floor_figure = Figure("rss", "any", "import floor: asyncio, ssl, aiohttp.web, uvloop",
                          ms(floor_found["p50"]), "ms",
                          note=f"p50 of {runs}: an interpreter imports them, exits")  # fmt: skip
    stop_found, cpu_found = summary(stops), summary(stop_cpu)
    stop_figure = Figure("rss", "sqlite", "SIGTERM to exit (leader)", ms(stop_found["p50"]),
                         "ms", note=f"p50 of {runs}, max {ms(stop_found['max']):.0f} ms; CPU "
                                    f"meanwhile p50 {ms(cpu_found['p50']):.0f} ms (release, stop, "
                                    "exit; /proc ticks: +-10 ms)")  # fmt: skip
    data = {**found, "samples": samples, "dev_venv": {**dev_found, "samples": dev},
            "import_floor": {**floor_found, "samples": floor},
            "stop": {**stop_found, "samples": stops, "cpu_seconds": stop_cpu}}  # fmt: skip
    return [figure, floor_figure, stop_figure], data
