"""What an etcd client adds to a leaderd daemon: memory and time, on top of what the daemon
has loaded anyway (aiohttp's server, prometheus-client, uvloop), for one read and one watch.

    python -m bench.etcd_client_cost --endpoint http://127.0.0.1:2379 --client gateway
    python -m bench.etcd_client_cost --endpoint http://127.0.0.1:2379 --client aetcd

``gateway`` is leaderd's own backend (etcd's JSON gateway over aiohttp's client); ``aetcd``
is a maintained asyncio gRPC client (grpcio + protobuf), to be run from an interpreter that
has it (it is not a leaderd dependency). Prints one JSON line; docs/etcd.md has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import sys
import time
import urllib.parse
from typing import Any

KEY = b"/leaderd-cost/default/leader"


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "-"


async def gateway(endpoint: str) -> None:
    from leaderd.backends.etcd.backend import EtcdBackend

    host = urllib.parse.urlsplit(endpoint).netloc
    backend = EtcdBackend.from_url(f"etcd://{host}/?prefix=/leaderd-cost/")
    await backend.open(["default"])
    await backend.observe("default")
    while not backend.watching:  # noqa: ASYNC110 - until the watch stream is up
        await asyncio.sleep(0.001)
    await backend.close()


async def aetcd(endpoint: str) -> None:
    import aetcd

    parts = urllib.parse.urlsplit(endpoint)
    client = aetcd.Client(host=parts.hostname or "127.0.0.1", port=parts.port or 2379)
    await client.connect()
    await client.get(KEY)
    watch = await client.watch(KEY)
    await watch.cancel()
    await client.close()


async def measure(client: str, endpoint: str) -> dict[str, Any]:
    import leaderd.startup.daemon  # noqa: F401 - what a daemon has loaded before its backend

    before, t0 = rss_mb(), time.perf_counter()
    await {"gateway": gateway, "aetcd": aetcd}[client](endpoint)
    took, after = time.perf_counter() - t0, rss_mb()
    packages = ("aiohttp", "grpcio", "protobuf", "aetcd")
    return {
        "client": client,
        "rss_before_mb": round(before, 1),
        "rss_after_mb": round(after, 1),
        "added_mb": round(after - before, 1),
        "import_connect_read_watch_ms": round(took * 1000, 1),
        "python": sys.version.split()[0],
        "versions": {p: version(p) for p in packages},
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.etcd_client_cost")
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--client", choices=("gateway", "aetcd"), default="gateway")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.client, args.endpoint))))


if __name__ == "__main__":
    main()
