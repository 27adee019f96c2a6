"""What the fault proxy's two directions share: one client connection and its upstream
(``Link``), and how a byte stream is cut into units named by kind (``Units``)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Protocol


class Units(Protocol):
    def feed(self, data: bytes) -> list[tuple[str | None, bytes]]:
        """The whole units ``data`` completes, each with its kind (None: not one to act on)."""


class Link:
    """A client connection and its upstream, and what the two directions tell each other."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.writers = (client, server)
        self.framers: tuple[Units, Units] = (Raw(self), Raw(self))
        self.current: str | None = None  # the kind of the last request (HTTP: one at a time)
        self.ssl_pending = False  # PostgreSQL: the server's one-byte answer to SSLRequest
        self.statements: dict[bytes, str] = {}  # PostgreSQL: prepared statement -> kind
        self.silent = False  # a request was dropped: nothing passes any more
        self.lose_answer = False  # the next answer is lost and the connection cut
        self.late = False  # a request was delivered late: wait for its answer before EOF
        self.answered = asyncio.Event()

    def abort(self) -> None:
        for writer in self.writers:
            abort(writer)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class Raw:
    """Every chunk is one unit of no kind."""

    def __init__(self, link: Link) -> None:
        self.link = link

    def feed(self, data: bytes) -> list[tuple[str | None, bytes]]:
        return [(None, data)]


def abort(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        # ValueError: uvloop has already closed the descriptor (the peer reset first).
        with contextlib.suppress(OSError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
