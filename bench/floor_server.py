"""The floor of the API figures: the least an aiohttp answer costs on this machine.

``python -m bench.floor_server --socket PATH`` serves, on uvloop, the routes the /leader
and /watch trials use, with nothing of leaderd behind them: ``GET /leader`` answers a fixed
JSON body as large as a leaderd status (revision 0); ``GET /watch`` waits for one shared
future and answers that body; ``POST /resign`` resolves the future; ``GET /metrics`` counts
the waiters as ``leaderd_watchers``. bench/leader_load.py and bench/fanout.py time it with
the same load generators as the daemon: the difference is what leaderd's own code adds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvloop
from aiohttp import web

from tests.support.daemons import REPO, short_tempdir

# About the size of a leaderd status (a follower naming its leader, lease and members).
BODY = b'{"election":"default","revision":0,"role":"follower","is_leader":false,' + (
    b'"leader":{"node_id":"node-a","address":"10.0.0.1:8080"},"term":7,"pad":"' + b"x" * 240 + b'"}'
)


class Floor:
    def __init__(self) -> None:
        self.changed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting = 0

    async def watch(self, request: web.Request) -> web.Response:
        self.waiting += 1
        try:
            await self.changed
        finally:
            self.waiting -= 1
        return web.Response(body=BODY, content_type="application/json")

    async def resign(self, request: web.Request) -> web.Response:
        changed, self.changed = self.changed, asyncio.get_running_loop().create_future()
        changed.set_result(None)
        return web.Response(body=b"{}", content_type="application/json")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=f"leaderd_watchers {self.waiting}\n")

    async def leader(self, request: web.Request) -> web.Response:
        return web.Response(body=BODY, content_type="application/json")


async def serve(path: str) -> None:
    floor = Floor()
    app = web.Application()
    app.router.add_get("/watch", floor.watch)
    app.router.add_post("/resign", floor.resign)
    app.router.add_get("/metrics", floor.metrics)
    app.router.add_get("/leader", floor.leader)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.UnixSite(runner, path, backlog=1024).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


@dataclass(frozen=True)
class FloorServer:
    socket: str
    pid: int


@contextlib.asynccontextmanager
async def running() -> AsyncIterator[FloorServer]:
    """This server in a process of its own, until the block ends."""
    workdir = short_tempdir("ldf-")
    path = os.path.join(workdir, "floor.sock")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.floor_server", "--socket", path, cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        await asyncio.wait_for(proc.stdout.readline(), 30)  # "ready"
        yield FloorServer(path, proc.pid)
    finally:
        proc.kill()
        await proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor_server")
    parser.add_argument("--socket", required=True)
    uvloop.run(serve(parser.parse_args().socket))


if __name__ == "__main__":
    main()
