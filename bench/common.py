"""Shared pieces of the benchmark: statistics, figures, clusters of real daemons
(tests/support/daemons.py) and the backends they run on (their HTTP: unix_http.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import resource
import shutil
import sys
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Protocol

import orjson

from tests.support.daemons import REPO, Daemon, short_tempdir

from .unix_http import get_json, request

# ":immediate" is the advisory backend with takeover=immediate (docs/postgresql.md): a
# standby leads as soon as the server grants it the lock, even after a crash.
BACKENDS = ("sqlite", "postgresql", "postgresql+advisory", "postgresql+advisory:immediate")


@dataclasses.dataclass(frozen=True)
class Timing:
    ttl: float
    renew_interval: float
    retry_interval: float


# The daemon defaults: the steady-state and graceful-handover timing.
DEFAULT_TIMING = Timing(ttl=15.0, renew_interval=5.0, retry_interval=2.0)
# A short TTL, so a crash failover takes seconds (the tests' timing, tests/support/daemons.py).
SHORT_TIMING = Timing(ttl=2.0, renew_interval=0.5, retry_interval=0.25)
# The daemon's default log level: the tests' debug lines would be work production skips.
DAEMON_ARGS = ("--log-level", "info")


# ---- statistics and figures ----


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Sequence[float]) -> dict[str, float]:
    """n, p50, p99, max and mean of ``values`` (seconds stay seconds)."""
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values, default=math.nan),
        "mean": sum(values) / len(values) if values else math.nan,
    }


@dataclasses.dataclass
class Figure:
    """One line of the table: a measured value, and the target it is judged against."""

    family: str
    backend: str
    name: str
    value: float | None
    unit: str
    target: str = ""
    met: bool | None = None  # None: no target, or not measured
    note: str = ""

    def cell(self) -> str:
        if self.value is None or math.isnan(self.value):
            return "n/a"
        if self.unit == "ms":
            return f"{self.value:.1f} ms" if self.value >= 10 else f"{self.value:.2f} ms"
        if self.unit in ("req/s", "MB", "x TTL", "q/s", "%", "x"):
            digits = 0 if self.unit == "req/s" else 2
            return f"{self.value:,.{digits}f} {self.unit}"
        return f"{self.value:g} {self.unit}".strip()

    def verdict(self) -> str:
        return {True: "met", False: "MISSED", None: ""}[self.met]


def ms(seconds: float) -> float:
    return seconds * 1000.0


def judge(value: float | None, limit: float) -> bool | None:
    """value <= limit, or None when nothing was measured."""
    if value is None or math.isnan(value):
        return None
    return value <= limit


# ---- processes and resources ----


def raise_nofile(want: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards ``want`` (up to the hard limit);
    children inherit it. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon (private heap), RssFile (mapped files, mostly shared libraries) from
    /proc/PID/status, and Pss (shared pages divided among their users), in MiB."""
    wanted = {"VmRSS:": "rss", "RssAnon:": "anon", "RssFile:": "file", "Pss:": "pss"}
    found: dict[str, float] = {}
    for name in (f"/proc/{pid}/status", f"/proc/{pid}/smaps_rollup"):
        with contextlib.suppress(OSError), open(name) as f:
            for line in f:
                key = line.split(None, 1)[0] if line.strip() else ""
                if key in wanted:
                    found[wanted[key]] = int(line.split()[1]) / 1024
    return found


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` (VmRSS), in MiB."""
    return memory_mb(pid)["rss"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


async def until(what: str, timeout: float, check: Any, interval: float = 0.02) -> Any:
    """Await ``check()`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, TimeoutError):
            value = await check()
            if value:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)


# ---- load-generator processes (bench/loadgen.py) ----


def split(total: int, parts: int) -> list[int]:
    """``total`` spread over ``parts`` as evenly as possible, without empty parts."""
    shares = [total // parts + (i < total % parts) for i in range(parts)]
    return [n for n in shares if n]


@contextlib.asynccontextmanager
async def loadgens(argvs: Sequence[Sequence[str]]) -> AsyncIterator[list[LoadGen]]:
    """One `python -m bench.loadgen ARGV...` process per argv; killed on exit."""
    procs: list[LoadGen] = []
    try:
        for argv in argvs:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.loadgen", *argv, cwd=REPO,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                limit=256 * 1024 * 1024,  # an answer is one line, maybe with every latency
            )  # fmt: skip
            procs.append(LoadGen(proc))
        yield procs
    finally:
        for gen in procs:
            if gen.proc.returncode is None:
                gen.proc.kill()
            await gen.proc.wait()


@dataclasses.dataclass
class LoadGen:
    proc: asyncio.subprocess.Process

    async def tell(self, value: object) -> None:
        """Write one line to the load generator's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{value}\n".encode())
        await self.proc.stdin.drain()

    async def line(self, timeout: float) -> Any:
        """The next JSON line the load generator prints."""
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            code = await self.proc.wait()
            raise RuntimeError(f"load generator exited ({code}) without an answer")
        return orjson.loads(line)


class Served(Protocol):
    """A process serving leaderd's routes on a Unix socket: a daemon, or a floor server."""

    @property
    def socket(self) -> str: ...

    @property
    def pid(self) -> int: ...


# ---- clusters of real daemons ----


class Cluster:
    """N daemons in one election on one backend; restartable one at a time."""

    def __init__(self, backend_url: str, size: int, workdir: str, timing: Timing, tag: str) -> None:
        election = self.election = f"bench-{tag}-{uuid.uuid4().hex[:8]}"
        self.daemons = [
            Daemon(
                f"{tag}-{i}",
                backend_url,
                workdir=workdir,
                elections=[election],
                ttl=timing.ttl,
                renew_interval=timing.renew_interval,
                retry_interval=timing.retry_interval,
                extra_args=DAEMON_ARGS,
            )
            for i in range(size)
        ]

    async def start(self) -> None:
        for d in self.daemons:
            d.start()
        for d in self.daemons:
            await wait_ready(d)

    def stop(self) -> None:
        for d in self.daemons:
            with contextlib.suppress(Exception):
                d.stop(timeout=10)
            d.kill()

    async def restart(self, daemon: Daemon) -> None:
        """SIGTERM ``daemon`` (it hands over if it leads), start it again, wait till ready."""
        await asyncio.to_thread(daemon.stop, 30)
        daemon.start()
        await wait_ready(daemon)

    def alive(self) -> list[Daemon]:
        return [d for d in self.daemons if d.alive()]

    async def settled(self, timeout: float = 30.0) -> Daemon:
        """The leader, once every live daemon names the same one."""

        async def agreed() -> Daemon | None:
            views = [await get_json(d.socket, "/leader") for d in self.alive()]
            names = {(v["leader"] or {}).get("node_id") for v in views}
            if len(names) != 1 or None in names:
                return None
            return next(d for d in self.daemons if d.node_id in names)

        leader: Daemon = await until("the cluster to agree on a leader", timeout, agreed)
        return leader


async def wait_ready(daemon: Daemon, timeout: float = 30.0) -> None:
    async def ready() -> bool:
        if not daemon.alive():
            raise RuntimeError(f"{daemon.node_id} exited early:\n{daemon.log()[-2000:]}")
        return (await request(daemon.socket, "/ready")).status == 200

    await until(f"{daemon.node_id} to be ready", timeout, ready, interval=0.01)


def file_directory(backend_url: str) -> str | None:
    """The directory of a sqlite:// URL's file; None for other backends."""
    if not backend_url.startswith("sqlite:"):
        return None
    return os.path.dirname(urllib.parse.urlsplit(backend_url).path) or None


@contextlib.asynccontextmanager
async def cluster(backend_url: str, size: int, timing: Timing, tag: str) -> AsyncIterator[Cluster]:
    # Sockets and logs beside a SQLite file, as users start daemons (inotify sees the logs).
    workdir = file_directory(backend_url) or short_tempdir("ldb-")
    group = Cluster(backend_url, size, workdir, timing, tag)
    try:
        await group.start()
        yield group
    finally:
        group.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# ---- backends ----


class Backends:
    """Backend URLs for the bench: a SQLite file per cluster, one throwaway PostgreSQL."""

    def __init__(self, wanted: Sequence[str]) -> None:
        self.wanted = [b for b in wanted if b != "etcd"]  # etcd's own cluster: bench/etcd.py
        self.skipped: dict[str, str] = {}
        self._dir = short_tempdir("ldb-db-")
        self._pg: Any = None
        if any(b.startswith("postgresql") for b in wanted):
            self._start_pg()

    def _start_pg(self) -> None:
        from tests.support.pgserver import PgServer, PgServerError

        try:
            self._pg = PgServer()
        except PgServerError as exc:
            reason = f"PostgreSQL not available: {str(exc).splitlines()[0]}"
            for name in self.wanted:
                if name.startswith("postgresql"):
                    self.skipped[name] = reason

    @property
    def available(self) -> list[str]:
        return [b for b in self.wanted if b not in self.skipped]

    def url(self, backend: str) -> str:
        if backend == "sqlite":
            # As users write it: "sqlite:///" then an absolute path (so the path begins with
            # "//"), in a directory of its own that a cluster's sockets and logs share.
            directory = os.path.join(self._dir, uuid.uuid4().hex[:8])
            os.mkdir(directory)
            return f"sqlite:///{directory}/h.db"
        assert self._pg is not None, backend
        scheme, _, takeover = backend.partition(":")
        params = {"takeover": takeover} if takeover else {}
        url: str = self._pg.dsn(scheme=scheme, **params)
        return url

    def close(self) -> None:
        if self._pg is not None:
            self._pg.cleanup()
        shutil.rmtree(self._dir, ignore_errors=True)


@contextlib.contextmanager
def backends(wanted: Sequence[str]) -> Iterator[Backends]:
    group = Backends(wanted)
    try:
        yield group
    finally:
        group.close()
