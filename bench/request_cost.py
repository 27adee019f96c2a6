"""CPU per request of leaderd's API against bare aiohttp, in process, with no socket.

``python -m bench.request_cost [--requests N] [--batches B]`` feeds keep-alive
``GET /leader`` requests, one at a time as the load generator sends them, into one
connection's ``data_received`` on uvloop, with a transport that only collects the writes.
Both leaderd's app (``build_app`` on a leading Node on the static backend, its connections
made by ``connections.factory``) and bench/floor_server.py's app are fed alike, batches
alternating; each prints the least CPU per request of its batches (the least is the
cost without the noise of other work on the machine). ``--watch N`` times N long polls
woken by one change instead: leaderd's election publishing a new revision against the
floor's future. No figure is judged: it shows where leaderd's own code costs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop
from aiohttp import web

from leaderd.api.connections import Connections, factory
from leaderd.api.server import build_app
from leaderd.backends.base import Candidate
from leaderd.backends.static import StaticBackend
from leaderd.election.engine import Election
from leaderd.election.node import Node
from leaderd.election.timing import Timing

from . import floor_server

REQUEST = b"GET /leader HTTP/1.1\r\nHost: localhost\r\n\r\n"
WATCH = b"GET /watch?timeout=300 HTTP/1.1\r\nHost: localhost\r\n\r\n"


class Transport(asyncio.Transport):
    """Collects what the server writes and tells the feeder an answer ended."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = 0
        self.closing = False

    def write(self, data: Any) -> None:
        self.answered += 1

    def writelines(self, data: Any) -> None:
        self.answered += 1

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


Protocol = Any
_RUNNING: list[asyncio.Task[None]] = []


async def leaderd_server() -> tuple[Callable[[], Protocol], Callable[[], Awaitable[None]]]:
    backend = StaticBackend()
    await backend.open(["default"])
    election = Election("default", Candidate("node-a", "10.0.0.5:8080"), Timing(), backend)
    task = asyncio.create_task(election.run())
    while not election.status().leader:  # noqa: ASYNC110 - once, at set-up
        await asyncio.sleep(0.01)
    runner = web.AppRunner(build_app(Node("node-a", backend, {"default": election})))
    await runner.setup()
    make = factory(runner, Connections("unix"), access_log=None)

    async def change() -> None:
        election.resign(0.0, None)

    _RUNNING.append(task)  # the election loop runs as long as the process
    return make, change


async def floor() -> tuple[Callable[[], Protocol], Callable[[], Awaitable[None]]]:
    floor = floor_server.Floor(floor_server.BODY)
    app = web.Application()
    app.router.add_get("/watch", floor.watch)
    app.router.add_get("/leader", floor.leader)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    server = runner.server
    assert server is not None

    async def change() -> None:
        changed, floor.changed = floor.changed, asyncio.get_running_loop().create_future()
        changed.set_result(None)

    return server, change


async def leader_batch(make: Callable[[], Protocol], requests: int) -> float:
    """CPU seconds per request of ``requests`` keep-alive GETs on one connection."""
    proto, transport = make(), Transport()
    proto.connection_made(transport)
    await asyncio.sleep(0)
    start = time.process_time()
    for n in range(1, requests + 1):
        proto.data_received(REQUEST)
        while transport.answered < n:  # noqa: ASYNC110 - the same turns for both servers
            await asyncio.sleep(0)
    spent = time.process_time() - start
    proto.connection_lost(None)
    return spent / requests


async def watch_batch(
    make: Callable[[], Protocol], change: Callable[[], Awaitable[None]], waiters: int
) -> float:
    """CPU seconds per long poll from one change to every waiter answered."""
    pairs = [(make(), Transport()) for _ in range(waiters)]
    for proto, transport in pairs:
        proto.connection_made(transport)
        proto.data_received(WATCH)
    for _ in range(5):
        await asyncio.sleep(0)
    start = time.process_time()
    await change()
    while any(t.answered == 0 for _, t in pairs):  # noqa: ASYNC110 - as above
        await asyncio.sleep(0)
    spent = time.process_time() - start
    for proto, _ in pairs:
        proto.connection_lost(None)
    await asyncio.sleep(0.05)
    return spent / waiters


async def main(args: argparse.Namespace) -> None:
    servers = {"leaderd": await leaderd_server(), "aiohttp": await floor()}
    best = {name: float("inf") for name in servers}
    for _ in range(args.batches):
        for name, (make, change) in servers.items():
            gc.collect()
            if args.watch:
                cost = await watch_batch(make, change, args.watch)
                await asyncio.sleep(0.2)  # the re-election after the resign
            else:
                cost = await leader_batch(make, args.requests)
            best[name] = min(best[name], cost)
    what = f"woken long poll ({args.watch})" if args.watch else "GET /leader"
    for name, cost in best.items():
        print(f"{name:8} {cost * 1e6:6.2f} us per {what} (least of {args.batches})")
    print(f"ratio    {best['leaderd'] / best['aiohttp']:.3f}")


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.request_cost")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--watch", type=int, default=0, metavar="N")
    uvloop.run(main(parser.parse_args()))


if __name__ == "__main__":
    cli()
