"""One etcd election candidate with a lease TTL of our choosing, for the crash comparison:

    python -m bench.etcd_candidate --endpoint http://127.0.0.1:2379 --name E --proposal P

`etcdctl elect` (3.4) always campaigns on a 60 s session lease, with no flag to change
it, so a killed etcdctl leader is replaced only after up to a minute. This candidate
does what etcdctl does (grant a lease, keep it alive every TTL/3 like the Go client's
session, Campaign on the server's v3election API, print the proposal once elected,
Resign on SIGTERM/SIGINT) through etcd's JSON gRPC gateway, with a short lease.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import signal
import sys
from typing import Any

import aiohttp


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with http.post(url, json=body) as response:
        response.raise_for_status()
        return await response.json(content_type=None)


async def _keepalive(http: aiohttp.ClientSession, endpoint: str, lease: str, ttl: int) -> None:
    while True:
        await asyncio.sleep(ttl / 3)
        await _post(http, f"{endpoint}/v3/lease/keepalive", {"ID": lease})


async def campaign(endpoint: str, name: str, proposal: str, ttl: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
        lease = (await _post(http, f"{endpoint}/v3/lease/grant", {"TTL": ttl}))["ID"]
        keeper = asyncio.create_task(_keepalive(http, endpoint, lease, ttl))
        body = {"name": _b64(name), "value": _b64(proposal), "lease": lease}
        elected = asyncio.create_task(_post(http, f"{endpoint}/v3/election/campaign", body))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait((elected, stopping), return_when=asyncio.FIRST_COMPLETED)
        if elected.done():
            sys.stdout.write(proposal + "\n")
            sys.stdout.flush()
            await stop.wait()
            leader = elected.result()["leader"]
            await _post(http, f"{endpoint}/v3/election/resign", {"leader": leader})
        keeper.cancel()
        elected.cancel()
        await _post(http, f"{endpoint}/v3/lease/revoke", {"ID": lease})


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.etcd_candidate")
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--proposal", required=True)
    parser.add_argument("--ttl", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(campaign(args.endpoint, args.name, args.proposal, args.ttl))


if __name__ == "__main__":
    main()
