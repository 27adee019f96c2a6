"""A tiny HTTP client for the daemons' Unix sockets: one request per connection, the
answer's JSON, and the /metrics samples the figures read."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from typing import Any

import orjson


@dataclasses.dataclass
class Answer:
    status: int
    body: bytes
    at: float  # time.monotonic() when the whole body had arrived

    def json(self) -> Any:
        return orjson.loads(self.body)


async def request(
    socket_path: str, path: str, method: str = "GET", timeout: float = 10.0
) -> Answer:
    """One HTTP/1.1 request on its own connection; the answer is timed on arrival."""
    reader, writer = await asyncio.open_unix_connection(socket_path)
    try:
        head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        writer.write(head.encode())
        async with asyncio.timeout(timeout):
            return await read_answer(reader)
    finally:
        writer.close()


_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    length = _CONTENT_LENGTH.search(head)
    body = await reader.readexactly(int(length.group(1))) if length else await reader.read()
    return Answer(int(head.split(b" ", 2)[1]), body, time.monotonic())


async def get_json(socket_path: str, path: str, timeout: float = 10.0) -> Any:
    return (await request(socket_path, path, timeout=timeout)).json()


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


async def metric_samples(socket_path: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of /metrics: (name, labels, value)."""
    text = (await request(socket_path, "/metrics")).body.decode()
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            labels = dict(_LABEL.findall(match[2] or ""))
            samples.append((match[1], labels, float(match[3])))
    return samples


async def metric_sums(socket_path: str) -> dict[str, float]:
    """Every metric of /metrics, summed over its labels, by name."""
    sums: dict[str, float] = {}
    for name, _, value in await metric_samples(socket_path):
        sums[name] = sums.get(name, 0.0) + value
    return sums


async def backend_requests(socket_path: str) -> dict[str, float]:
    """Backend requests this daemon has made so far (the request histogram's count), by
    operation, and their sum under "total"."""
    counts = {"total": 0.0}
    for name, labels, value in await metric_samples(socket_path):
        if name == "leaderd_backend_request_seconds_count":
            op = labels.get("operation", "?")
            counts[op] = counts.get(op, 0.0) + value
            counts["total"] += value
    return counts
