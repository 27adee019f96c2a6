"""Load-generating clients, run as separate processes so they do not share the bench's loop:

    python -m bench.loadgen leader --socket S --connections C --warmup W --duration D
    python -m bench.loadgen watch  --socket S --clients N --revision R

Raw asyncio protocols on uvloop (no HTTP library on the client side), keep-alive, one
request in flight per connection (closed loop), so the latency of each request is its
own. Each prints one JSON line when it has measured; `watch` prints {"ready": ...} first
and then waits for the answers. CPU time of the client is reported so a saturated client
can be told from a slow daemon.
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


def _emit(data: dict[str, Any]) -> None:
    sys.stdout.buffer.write(orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS) + b"\n")
    sys.stdout.flush()


# ---- GET /leader, closed loop ----


class _LeaderConn(asyncio.Protocol):
    def __init__(self, run: _LeaderRun) -> None:
        self.run = run
        self.buf = bytearray()
        self.sent = 0.0
        self.transport: asyncio.Transport | None = None
        self.done = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
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
                self._send()
            elif not self.done.done():
                self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


class _LeaderRun:
    def __init__(self, path: str, warmup: float, duration: float) -> None:
        self.request = f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
        now = time.perf_counter()
        self.record_from = now + warmup
        self.stop_at = self.record_from + duration
        self.latencies = array("d")
        self.statuses: dict[int, int] = {}

    def record(self, status: int, latency: float, now: float) -> None:
        if now >= self.record_from:
            self.latencies.append(latency)
            self.statuses[status] = self.statuses.get(status, 0) + 1


async def leader(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    run = _LeaderRun(args.path, args.warmup, args.duration)
    conns = []
    for _ in range(args.connections):
        _, conn = await loop.create_unix_connection(lambda: _LeaderConn(run), args.socket)
        conns.append(conn)
    await asyncio.sleep(max(0.0, run.record_from - time.perf_counter()))
    _emit({"recording": True})
    cpu0, t0 = _cpu(), time.perf_counter()
    await asyncio.gather(*(c.done for c in conns))
    elapsed, cpu = time.perf_counter() - t0, _cpu() - cpu0
    for conn in conns:
        if conn.transport is not None:
            conn.transport.close()
    _emit(
        {
            "requests": len(run.latencies),
            "seconds": elapsed,
            "cpu_seconds": cpu,
            "statuses": run.statuses,
            "latencies_us": [round(x * 1e6, 1) for x in run.latencies],
        }
    )


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
    p.add_argument("--socket", required=True)
    p.add_argument("--path", default="/leader")
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=5.0)
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
