"""Load-generating clients, run as separate processes so they do not share the bench's loop:

    python -m bench.loadgen leader --socket A [--socket B] --connections C --order 0,1,1,0
                                   --window W     # then the start time on stdin
    python -m bench.loadgen watch  --socket S --clients N --revision R

Raw asyncio protocols on uvloop (no HTTP library on the client side), keep-alive, one
request in flight per connection (closed loop), so the latency of each request is its
own. Each prints one JSON line when it has measured; `leader` prints {"connected": true}
and `watch` {"ready": ...} first. `leader` keeps the connections of one server busy per
window, on a schedule every load generator process shares, so leaderd and its peer are
measured in alternating windows by the same clients. CPU time of the client is reported
so a saturated client can be told from a slow daemon.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import re
import resource
import sys
import time
from array import array
from typing import Any, cast

import orjson

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _split(buf: bytearray) -> tuple[int, int] | None:
    """(status, length) of the first complete response in ``buf``, or None."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buf[: end + 2])
    match = _CONTENT_LENGTH.search(head)
    total = end + 4 + (int(match.group(1)) if match else 0)
    if len(buf) < total:
        return None
    return int(head[9:12]), total


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _emit(data: dict[str, Any]) -> None:
    sys.stdout.buffer.write(orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS) + b"\n")
    sys.stdout.flush()


# ---- GET /leader, closed loop, alternating between servers ----


class _LeaderConn(asyncio.Protocol):
    def __init__(self, run: _LeaderRun) -> None:
        self.run = run
        self.buf = bytearray()
        self.sent = 0.0
        self.transport: asyncio.Transport | None = None
        self.idle = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def send(self) -> None:
        assert self.transport is not None
        self.idle = False
        self.sent = time.perf_counter()
        self.transport.write(self.run.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (split := _split(self.buf)) is not None:
            status, total = split
            del self.buf[:total]
            now = time.perf_counter()
            self.run.record(status, now - self.sent, now)
            if now < self.run.stop_at:
                self.send()
            else:
                self.idle = True
                self.run.drained()

    def connection_lost(self, exc: Exception | None) -> None:
        self.idle = True
        self.run.drained()


class _LeaderRun:
    """One window's counts: the connections of one server busy until ``stop_at``."""

    def __init__(self, path: str) -> None:
        self.request = f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
        self.stop_at = 0.0
        self.conns: list[_LeaderConn] = []
        self.window: dict[str, Any] = {}
        self.latencies = array("d")
        self.done: asyncio.Future[None] | None = None

    def open(self, stop_at: float) -> None:
        self.stop_at = stop_at
        self.latencies = array("d")
        self.window = {"requests": 0, "statuses": {}, "first_sent": time.perf_counter()}
        self.done = asyncio.get_running_loop().create_future()
        for conn in self.conns:
            conn.send()

    def record(self, status: int, latency: float, now: float) -> None:
        self.latencies.append(latency)
        self.window["requests"] += 1
        self.window["last_answer"] = now
        statuses = self.window["statuses"]
        statuses[status] = statuses.get(status, 0) + 1

    def drained(self) -> None:
        if self.done is not None and not self.done.done() and all(c.idle for c in self.conns):
            self.done.set_result(None)


async def leader(args: argparse.Namespace) -> None:
    """Windows of ``--window`` seconds on a schedule shared with the other load generator
    processes (its start, on CLOCK_MONOTONIC, is read from stdin once connected): window i
    keeps the connections to socket ``order[i]`` busy, the others idle, and waits for
    their last answers."""
    loop = asyncio.get_running_loop()
    runs = [_LeaderRun(args.path) for _ in args.socket]
    for run, path in zip(runs, args.socket, strict=True):
        for _ in range(args.connections):
            _, conn = await loop.create_unix_connection(lambda r=run: _LeaderConn(r), path)
            run.conns.append(conn)
    _emit({"connected": True})
    # The schedule's start (time.monotonic()), once every process has connected.
    start_at = float(await loop.run_in_executor(None, sys.stdin.readline))
    windows = []
    cpu0 = _cpu()
    for i, which in enumerate(args.order):
        begin = start_at + i * (args.window + args.gap)
        await asyncio.sleep(max(0.0, begin - time.monotonic()))
        run = runs[which]
        run.open(time.perf_counter() + args.window)
        assert run.done is not None
        await run.done
        window = run.window
        window["socket"] = which
        window["seconds"] = window.get("last_answer", window["first_sent"]) - window["first_sent"]
        if args.latencies:
            window["latencies_us"] = [round(x * 1e6, 1) for x in run.latencies]
        windows.append(window)
    for run in runs:
        for conn in run.conns:
            if conn.transport is not None:
                conn.transport.close()
    _emit({"windows": windows, "cpu_seconds": _cpu() - cpu0})


# ---- GET /watch, N long polls answered by one change ----


class _WatchConn(asyncio.Protocol):
    def __init__(self, run: _WatchRun) -> None:
        self.run = run
        self.buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).write(self.run.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        split = _split(self.buf)
        if split is not None:
            self.run.answered(split[0])


class _WatchRun:
    def __init__(self, path: str, clients: int) -> None:
        self.request = f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
        self.clients = clients
        self.arrivals = array("d")
        self.statuses: dict[int, int] = {}
        self.all_answered = asyncio.get_running_loop().create_future()

    def answered(self, status: int) -> None:
        self.arrivals.append(time.monotonic())
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if len(self.arrivals) == self.clients and not self.all_answered.done():
            self.all_answered.set_result(None)


async def _connect(
    loop: asyncio.AbstractEventLoop, run: _WatchRun, path: str, gate: asyncio.Semaphore
) -> asyncio.BaseTransport:
    """One connection; a full listen backlog (EAGAIN on a Unix socket) is retried."""
    async with gate:
        for attempt in range(200):
            try:
                transport, _ = await loop.create_unix_connection(lambda: _WatchConn(run), path)
                return transport
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.ECONNREFUSED) or attempt == 199:
                    raise
                await asyncio.sleep(0.005)
    raise AssertionError("unreachable")


async def watch(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    path = f"/watch?revision={args.revision}&timeout={args.timeout}"
    run = _WatchRun(path, args.clients)
    gate = asyncio.Semaphore(64)
    transports = await asyncio.gather(
        *(_connect(loop, run, args.socket, gate) for _ in range(args.clients))
    )
    _emit({"ready": len(transports)})
    cpu0 = _cpu()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(run.all_answered, args.timeout + 10)
    cpu = _cpu() - cpu0
    for transport in transports:
        transport.close()
    arrivals = sorted(run.arrivals)
    _emit(
        {
            "answered": len(arrivals),
            "first": arrivals[0] if arrivals else None,
            "last": arrivals[-1] if arrivals else None,
            "cpu_seconds": cpu,
            "statuses": run.statuses,
        }
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen")
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("leader")
    p.add_argument("--socket", required=True, action="append", help="once per server")
    p.add_argument("--path", default="/leader")
    p.add_argument("--connections", type=int, default=8, help="per server")
    p.add_argument("--order", type=_ints, required=True, help="server index per window")
    p.add_argument("--window", type=float, default=1.0, help="seconds per window")
    p.add_argument("--gap", type=float, default=0.1, help="seconds between windows")
    p.add_argument("--latencies", action="store_true", help="report every latency")
    w = sub.add_parser("watch")
    w.add_argument("--socket", required=True)
    w.add_argument("--clients", type=int, required=True)
    w.add_argument("--revision", type=int, required=True)
    w.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = getattr(args, "clients", 0) + 256
    if soft < want <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(leader(args) if args.mode == "leader" else watch(args))


if __name__ == "__main__":
    main()
