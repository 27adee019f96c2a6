"""The floor of the /watch fan-out: the least an aiohttp long poll costs on this machine.

``python -m bench.floor_server --socket PATH`` serves, on uvloop, the three routes the
fan-out trial uses, with nothing of leaderd behind them: ``GET /watch`` waits for one
shared future and answers a fixed JSON body as large as a leaderd status; ``POST /resign``
resolves that future; ``GET /metrics`` counts the waiters as ``leaderd_watchers`` and
``GET /leader`` names revision 0. bench/fanout.py times it with the same load generator as
the daemon: the difference is what leaderd's own code adds.
"""

from __future__ import annotations

import argparse
import asyncio

import uvloop
from aiohttp import web

# About the size of a leaderd status (a follower naming its leader, lease and members).
BODY = b'{"election":"default","revision":2,"role":"follower","is_leader":false,' + (
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
        return web.Response(body=b'{"revision":0}', content_type="application/json")


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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor_server")
    parser.add_argument("--socket", required=True)
    uvloop.run(serve(parser.parse_args().socket))


if __name__ == "__main__":
    main()
