"""The release's own connection: one HTTP/1.1 connection to the preferred member, opened
while this node leads, on which a release's transaction is written the moment it is made
(docs/etcd.md, "The release's own connection").

Through aiohttp's client a request reaches its socket about half a millisecond after it is
made once its code has gone cold in seconds of idleness (the URL, the headers, the pool, a
task for the body). On an open connection it is one write, and a hand-over's heir waits for
exactly that write.

The line carries one request at a time, and only releases. What it cannot do (not open yet,
busy, another member preferred since, a broken connection, no answer in its half of the
time, an answer that sends the request to another member or asks for a new login) it leaves
to the client, which sends the transaction again. That is safe because every release
compares the holder's own mod revision: a copy that lands after the first changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import TYPE_CHECKING, Any, cast

import orjson

from .errors import ELSEWHERE, UNAUTHENTICATED, EtcdError, checked_answer

if TYPE_CHECKING:
    from .gateway import EtcdClient

_OPEN_TIMEOUT = 2.0  # a member that does not accept a connection by then: the client's path
_MAX_ANSWER = 1024 * 1024  # a release's answer is a few hundred bytes

Answer = tuple[int, bytes]  # HTTP status, body


class ReleaseLine:
    """The line of one etcd client; ``client`` None: none (the protocol model's)."""

    def __init__(self, client: EtcdClient | None) -> None:
        self._client = client
        self._connection: _Connection | None = None
        self._opening: asyncio.Task[None] | None = None
        self.answered = 0  # releases answered on the line

    @property
    def open(self) -> bool:
        client, connection = self._client, self._connection
        return client is not None and connection is not None and connection.usable(client.endpoint)

    def keep_open(self) -> None:
        """Open the line to the preferred member in the background, unless it is open."""
        client = self._client
        if client is None or (self._opening is not None and not self._opening.done()):
            return
        if self.open:
            return
        self._drop()
        self._opening = asyncio.get_running_loop().create_task(self._open(client))

    async def post(self, path: str, body: dict[str, Any], timeout: float, doing: str) -> Any:
        """etcd's answer to ``body``, sent on the line within ``timeout``; None if the line
        cannot carry it or its answer is the client's to handle (another member, a login).
        ``doing`` says what the request is, as to the client (the protocol model's line
        sorts its requests by it)."""
        client, connection = self._client, self._connection
        if client is None or connection is None or not self.open:
            return None
        if connection.busy or (client.settings.user and not client.token):
            return None
        payload = orjson.dumps(body)
        head = f"POST {path} HTTP/1.1\r\nHost: {connection.host}\r\n"
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        if client.settings.user:
            head += f"Authorization: {client.token}\r\n"
        answered = connection.send(head.encode() + b"\r\n" + payload)
        try:
            async with asyncio.timeout(timeout):
                status, data = await answered
        except (TimeoutError, ConnectionError):
            return None
        finally:
            if not answered.done() or answered.cancelled():
                self._drop()  # its answer may still come: nothing else may read it
        try:
            answer = checked_answer(connection.host, status, data)
        except EtcdError as exc:
            if exc.code in ELSEWHERE or exc.code == UNAUTHENTICATED:
                return None  # the client's: another member, or a new login
            raise
        self.answered += 1
        return answer

    async def close(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._opening
        self._drop()

    async def _open(self, client: EtcdClient) -> None:
        endpoint = client.endpoint
        host, _, port = endpoint.split("://", 1)[1].rpartition(":")
        loop = asyncio.get_running_loop()
        # A member that refuses is the client's to report: its next request tells why.
        with contextlib.suppress(OSError, TimeoutError, ssl.SSLError):
            async with asyncio.timeout(_OPEN_TIMEOUT):
                _, connection = await loop.create_connection(
                    lambda: _Connection(endpoint), host.strip("[]"), int(port), ssl=client.tls
                )
            self._connection = connection

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection that carries one request at a time."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint, self.host = endpoint, endpoint.split("://", 1)[1]
        self._transport: asyncio.Transport | None = None
        self._buffer = b""
        self._answer: asyncio.Future[Answer] | None = None
        self._closed = False

    @property
    def busy(self) -> bool:
        return self._answer is not None and not self._answer.done()

    def usable(self, endpoint: str) -> bool:
        return self._transport is not None and not self._closed and self.endpoint == endpoint

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        assert self._transport is not None and not self.busy
        self._answer = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        return self._answer

    def close(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._fail(ConnectionResetError(f"{self.host}: the member closed the connection"))

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            found = response(self._buffer)
        except ValueError as exc:
            found = None
            self._fail(ConnectionError(f"{self.host}: a garbled answer ({exc})"))
        if found is None:
            if len(self._buffer) > _MAX_ANSWER or self._answer is None or self._answer.done():
                self.close()  # unasked, garbled or endless: the line is done
            return
        status, body, keep_alive = found
        self._buffer = b""
        if self._answer is not None and not self._answer.done():
            self._answer.set_result((status, body))
        if not keep_alive:
            self.close()

    def _fail(self, exc: Exception) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc)
            self._answer.exception()  # retrieved: a request that gave up does not care


def response(data: bytes) -> tuple[int, bytes, bool] | None:
    """The status, the body, and whether the connection stays open, of the complete HTTP/1.1
    response at the start of ``data``; None while it is incomplete. ValueError if garbled."""
    head, found, rest = data.partition(b"\r\n\r\n")
    if not found:
        return None
    status_line, *lines = head.split(b"\r\n")
    fields = {}
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon:
            raise ValueError(f"a header line without a colon: {line[:40]!r}")
        fields[name.strip().lower()] = value.strip().lower()
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP/1.1 status line: {status_line[:40]!r}")
    keep_alive = fields.get(b"connection") != b"close"
    if fields.get(b"transfer-encoding") == b"chunked":
        body = dechunked(rest)
    elif (length := fields.get(b"content-length")) is not None:
        size = int(length)
        body = rest[:size] if len(rest) >= size else None
    else:
        raise ValueError("neither a length nor chunks")  # the gateway always sends one
    return None if body is None else (int(parts[1]), body, keep_alive)


def dechunked(data: bytes) -> bytes | None:
    """The body of a chunked message body; None while incomplete. ValueError if garbled."""
    chunks: list[bytes] = []
    at = 0
    while True:
        line_end = data.find(b"\r\n", at)
        if line_end < 0:
            return None
        size = int(data[at:line_end].split(b";", 1)[0], 16)
        if size == 0:  # then trailer lines, each ended by CRLF, and an empty line
            return b"".join(chunks) if data.find(b"\r\n\r\n", line_end) >= 0 else None
        start = line_end + 2
        if len(data) < start + size + 2:
            return None
        chunks.append(data[start : start + size])
        at = start + size + 2
