"""A fault-injecting TCP proxy: one per daemon, between it and PostgreSQL, on 127.0.0.1.

Faults are real network behaviour on real sockets:

* latency: every chunk waits ``delay`` seconds before it is passed on (both directions,
  order kept), so a round trip takes ``2 * delay`` more;
* blackhole: nothing passes either way and new connections get no upstream, as when
  packets are dropped; bytes already sent wait, as TCP retransmissions would, and flow
  again when the blackhole ends (or find the other side gone by then);
* reset: every open connection is aborted with a TCP RST on both sides;
* hold: the next client-to-server chunk that contains a given byte string (a statement's
  text, or a parameter of its Bind) waits ``seconds`` on its connection, the bytes behind it
  too, then reaches the server although the client gave up on it long ago; optionally the
  proxy then blackholes, so the client hears of nothing that followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct


class FaultProxy:
    def __init__(self, name: str, upstream_host: str, upstream_port: int) -> None:
        self.name = name
        self.upstream = (upstream_host, upstream_port)
        self.delay = 0.0
        self.port = 0
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0
        self._hold: tuple[bytes, float, bool] | None = None
        self.held = asyncio.Event()  # set once a held chunk reached the server

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        self.heal()
        if self._server is not None:
            self._server.close()
        self.reset()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- faults ----

    def blackhole(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self.delay = 0.0
        self._open.set()

    def hold_next(self, pattern: bytes, seconds: float, then_blackhole: bool = False) -> None:
        """Hold the next client-to-server chunk containing ``pattern`` for ``seconds``."""
        self._hold, self.held = (pattern, seconds, then_blackhole), asyncio.Event()

    def reset(self) -> int:
        """Abort every open connection with an RST on both sides; how many were open."""
        links = list(self._links)
        for pair in links:
            for writer in pair:
                _abort(writer)
        self._links.clear()
        return len(links)

    # ---- plumbing ----

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            await self._open.wait()  # a blackholed SYN: no upstream until it heals
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                _abort(writer)
                return
            self.connections += 1
            link = (writer, up_writer)
            self._links.add(link)
            try:
                await asyncio.gather(
                    self._pump(reader, up_writer, upstream=True), self._pump(up_reader, writer)
                )
            finally:
                self._links.discard(link)
                for w in link:
                    w.close()
        except (asyncio.CancelledError, OSError):
            _abort(writer)
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, upstream: bool = False
    ) -> None:
        try:
            while True:
                data = await src.read(65536)
                if upstream and self._hold is not None and self._hold[0] in data:
                    await self._deliver_late(data, dst)
                    continue
                await self._open.wait()
                if self.delay > 0:
                    await asyncio.sleep(self.delay)
                if not data:
                    break
                dst.write(data)
                await dst.drain()
            if not dst.is_closing() and dst.can_write_eof():
                dst.write_eof()
        except (OSError, RuntimeError):  # the other side was reset meanwhile
            _abort(dst)

    async def _deliver_late(self, data: bytes, dst: asyncio.StreamWriter) -> None:
        assert self._hold is not None
        (_, seconds, then_blackhole), self._hold = self._hold, None
        await asyncio.sleep(seconds)
        dst.write(data)
        await dst.drain()
        if then_blackhole:
            self.blackhole()
        self.held.set()


def _abort(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        # ValueError: uvloop has already closed the descriptor (the peer reset first).
        with contextlib.suppress(OSError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
