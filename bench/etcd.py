"""The same handover and failover, side by side, on a real etcd (Debian's etcd-server and
etcd-client), so the table shows leaderd against a widely used election service.

* etcd runs on loopback in a temporary directory, one member, `--unsafe-no-fsync` like the
  bench's PostgreSQL (fsync=off) unless fsync is asked for.
* graceful: three `etcdctl elect NAME PROPOSAL` candidates; SIGTERM the leader's etcdctl
  (it resigns on SIGTERM/SIGINT) and time until the next candidate prints its proposal.
* crash: `etcdctl elect` campaigns on a fixed 60 s session lease (no flag in etcdctl 3.4),
  so candidates from bench/etcd_candidate.py do the same on a 2 s lease (etcd's minimum with
  its default 100 ms heartbeat, and the TTL of leaderd's crash failover) through etcd's
  JSON gateway; SIGKILL the leader and time until the next one prints its proposal.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from tests.daemons import REPO

from .common import Figure, ms, summary

CANDIDATES = 3
LEASE_TTL = 2
INSTALL = "apt-get install -y etcd-server etcd-client"


def missing() -> str | None:
    """Why the etcd comparison cannot run here, or None."""
    absent = [b for b in ("etcd", "etcdctl") if shutil.which(b) is None]
    return f"{' and '.join(absent)} not installed ({INSTALL})" if absent else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@asynccontextmanager
async def etcd_server(fsync: bool) -> AsyncIterator[str]:
    """A one-member etcd on loopback; yields its client URL."""
    workdir = tempfile.mkdtemp(prefix="ldb-etcd-")
    client, peer = f"http://127.0.0.1:{_free_port()}", f"http://127.0.0.1:{_free_port()}"
    args = [
        "etcd", "--name", "bench", "--data-dir", os.path.join(workdir, "data"),
        "--listen-client-urls", client, "--advertise-client-urls", client,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"bench={peer}", "--log-level", "error",
    ]  # fmt: skip
    if not fsync:
        args.append("--unsafe-no-fsync")
    proc = _start(args, os.path.join(workdir, "etcd.log"))
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(300):
                try:
                    async with http.get(f"{client}/health") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError(f"etcd exited {proc.returncode}; see {workdir}/etcd.log")
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError("etcd did not become healthy in 15 s")
        yield client
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)
        shutil.rmtree(workdir, ignore_errors=True)


def _start(args: list[str], log_path: str) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)


@dataclasses.dataclass
class Candidate:
    proc: asyncio.subprocess.Process
    proposal: str
    elected: asyncio.Future[float]  # time.monotonic() when it printed its proposal
    reader: asyncio.Task[None]


async def _spawn(args: list[str], proposal: str) -> Candidate:
    proc = await asyncio.create_subprocess_exec(
        *args, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    elected: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def read() -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            if line.strip() == proposal.encode() and not elected.done():
                elected.set_result(time.monotonic())

    return Candidate(proc, proposal, elected, asyncio.create_task(read()))


async def _registered(http: aiohttp.ClientSession, client: str, name: str) -> int:
    """How many candidates wait in the election (keys under NAME/)."""
    prefix = base64.b64encode(f"{name}/".encode()).decode()
    end = base64.b64encode(f"{name}0".encode()).decode()
    body = {"key": prefix, "range_end": end, "count_only": True}
    async with http.post(f"{client}/v3/kv/range", json=body) as response:
        return int((await response.json(content_type=None)).get("count", 0))


async def _rounds(client: str, command: list[str], signum: int, count: int) -> list[float]:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    serial = 0
    candidates: list[Candidate] = []

    async def add() -> None:
        nonlocal serial
        serial += 1
        proposal = f"p{serial}"
        argv = [a.format(client=client, name=name, proposal=proposal) for a in command]
        candidates.append(await _spawn(argv, proposal))
        while await _registered(http, client, name) < len(candidates):  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    samples = []
    async with aiohttp.ClientSession() as http:
        try:
            for _ in range(CANDIDATES):
                await add()
            for _ in range(count):
                leader = next(c for c in candidates if c.elected.done())
                await asyncio.sleep(0.05)  # let the previous leader's key go before signalling
                others = [c.elected for c in candidates if c is not leader]
                t0 = time.monotonic()
                leader.proc.send_signal(signum)
                done, _ = await asyncio.wait(
                    others, timeout=120, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    raise RuntimeError("no etcd candidate took over within 120 s")
                samples.append(done.pop().result() - t0)
                await leader.proc.wait()
                leader.reader.cancel()
                candidates.remove(leader)
                await add()
        finally:
            for c in candidates:
                if c.proc.returncode is None:
                    c.proc.kill()
                await c.proc.wait()
                c.reader.cancel()
    return samples


async def measure(handovers: int, failovers: int, fsync: bool) -> tuple[list[Figure], Any]:
    etcdctl = ["etcdctl", "--endpoints={client}", "elect", "{name}", "{proposal}"]
    python = [
        sys.executable, "-m", "bench.etcd_candidate", "--endpoint", "{client}",
        "--name", "{name}", "--proposal", "{proposal}", "--ttl", str(LEASE_TTL),
    ]  # fmt: skip
    async with etcd_server(fsync) as client:
        graceful = await _rounds(client, etcdctl, signal.SIGTERM, handovers)
        crash = await _rounds(client, python, signal.SIGKILL, failovers)
    g, c = summary(graceful), summary(crash)
    backend = "etcd" + ("" if fsync else " (no fsync)")
    figures = [
        Figure("etcd", backend, "etcdctl elect graceful handover p50", ms(g["p50"]), "ms"),
        Figure(
            "etcd",
            backend,
            "etcdctl elect graceful handover p99",
            ms(g["p99"]),
            "ms",
            note=f"n={g['n']}, max {ms(g['max']):.1f} ms; SIGTERM to etcdctl (it resigns)",
        ),
        Figure("etcd", backend, "crash failover p50", ms(c["p50"]), "ms"),
        Figure(
            "etcd",
            backend,
            "crash failover p99",
            ms(c["p99"]),
            "ms",
            note=f"n={c['n']}; v3election Campaign, {LEASE_TTL} s lease, SIGKILL",
        ),
        Figure(
            "etcd",
            backend,
            f"crash failover p99 / TTL ({LEASE_TTL} s)",
            c["p99"] / LEASE_TTL,
            "x TTL",
            note="etcdctl elect itself: 60 s session lease, no flag to change it",
        ),
    ]
    data = {
        "fsync": fsync,
        "graceful": {**g, "samples": graceful},
        "crash": {**c, "samples": crash, "lease_ttl": LEASE_TTL},
    }
    return figures, data
