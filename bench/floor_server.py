"""The floor of the API figures: the least an aiohttp answer costs on this machine.

``python -m bench.floor_server --socket PATH [--body FILE]`` serves, on uvloop, the routes
the /leader and /watch trials use, from a bare aiohttp ``web.Application`` with nothing of
leaderd behind it: ``GET /leader`` answers a fixed JSON body (the daemon's own /leader
answer, read from FILE, so both send the same bytes); ``GET /watch`` waits for one shared
future and answers that body; ``POST /resign`` resolves the future; ``GET /metrics`` counts
the waiters as ``leaderd_watchers``. bench/leader_load.py and bench/fanout.py time it with
the same load generators as the daemon, interleaved with it: the ratio of the two is what
leaderd's own code costs over aiohttp's.
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
from pathlib import Path

import uvloop
from aiohttp import web

from tests.support.daemons import REPO, short_tempdir

# Without --body: about a leaderd status's size (a follower naming its leader and term).
BODY = b'{"election":"default","revision":0,"role":"follower","is_leader":false,' + (
    b'"leader":{"node_id":"node-a","address":"10.0.0.1:8080"},"term":7,"pad":"' + b"x" * 240 + b'"}'
)


class Floor:
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.changed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting = 0

    async def watch(self, request: web.Request) -> web.Response:
        self.waiting += 1
        try:
            await self.changed
        finally:
            self.waiting -= 1
        return web.Response(body=self.body, content_type="application/json")

    async def resign(self, request: web.Request) -> web.Response:
        changed, self.changed = self.changed, asyncio.get_running_loop().create_future()
        changed.set_result(None)
        return web.Response(body=b"{}", content_type="application/json")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=f"leaderd_watchers {self.waiting}\n")

    async def leader(self, request: web.Request) -> web.Response:
        return web.Response(body=self.body, content_type="application/json")


async def serve(path: str, body: bytes) -> None:
    floor = Floor(body)
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
async def running(body: bytes = BODY) -> AsyncIterator[FloorServer]:
    """This server, answering ``body``, in a process of its own until the block ends."""
    workdir = short_tempdir("ldf-")
    path = os.path.join(workdir, "floor.sock")
    body_file = os.path.join(workdir, "body.json")
    Path(body_file).write_bytes(body)  # noqa: ASYNC240 - a few hundred bytes, once
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.floor_server", "--socket", path, "--body", body_file,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,  # like the daemons: its own session (and scheduler autogroup)
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
    parser.add_argument("--body", help="file holding the JSON body to answer")
    args = parser.parse_args()
    body = BODY
    if args.body:
        with open(args.body, "rb") as f:
            body = f.read()
    uvloop.run(serve(args.socket, body))


if __name__ == "__main__":
    main()
