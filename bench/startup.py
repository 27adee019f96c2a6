"""Start-up: from the daemon's process start to its READY=1 on SQLite (issue 12's figure).

The daemon is spawned with NOTIFY_SOCKET naming a datagram socket the bench binds, as
systemd's Type=notify does; each run times the spawn to the READY=1 datagram on a fresh
SQLite file, so the figure includes the interpreter, the imports, the first round and the
socket: everything a restart under systemd waits for.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

from tests.daemons import Daemon, short_tempdir

from .common import DAEMON_ARGS, Figure, judge, ms, summary

STARTUP_MS = 300.0  # issue 12: process start to READY=1 on SQLite


async def one_start(workdir: str, run: int) -> float:
    """Seconds from spawning a daemon to its READY=1."""
    path = os.path.join(workdir, f"notify-{run}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(path)
        notify.setblocking(False)
        url = f"sqlite://{workdir}/start-{run}.db"
        daemon = Daemon(f"start-{run}", url, workdir=workdir, extra_args=DAEMON_ARGS,
                        env={"NOTIFY_SOCKET": path})  # fmt: skip
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        daemon.start()
        try:
            async with asyncio.timeout(30):
                while b"READY=1" not in (await loop.sock_recv(notify, 4096)).split(b"\n"):
                    pass
            return time.monotonic() - t0
        finally:
            daemon.kill()


async def measure(runs: int = 5) -> tuple[list[Figure], dict[str, Any]]:
    workdir = short_tempdir("ldb-")
    samples = [await one_start(workdir, run) for run in range(runs)]
    found = summary(samples)
    figure = Figure("rss", "sqlite", "start to READY=1", ms(found["p50"]), "ms",
                    f"<= {STARTUP_MS:g} ms", judge(ms(found["p50"]), STARTUP_MS),
                    note=f"p50 of {runs} starts; min {ms(min(samples)):.0f} ms, "
                         f"max {ms(found['max']):.0f} ms")  # fmt: skip
    return [figure], {**found, "samples": samples}
