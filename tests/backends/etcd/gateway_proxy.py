"""A fault proxy for the etcd gRPC gateway (HTTP/1.1 + JSON), per kind of request.

One daemon's traffic to one etcd member goes through it, on 127.0.0.1, in a thread of its
own (a test's blocking calls never delay it). It reads each request's line and body, so it
can fault the requests of chosen paths (``/v3/kv/lease/timetolive``, ``/v3/lease/keepalive``,
``/v3/kv/txn``, ...), before etcd sees them:

* hold: the request is never sent on, as a stalled request or a blackhole would have it;
  the client gives up on it after its timeout and closes the connection;
* refuse: the connection is reset (RST) instead, as a partition that rejects packets
  would: the client fails at once;
* delay: the request is sent on that many seconds late, as a slow link or a busy member
  would have it.

Answers flow back as they come. ``/v3/watch`` is faulted or spared like any other path, so a
test can cut a daemon off from every request but its watch, or from everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass

from leaderd.clock import boottime
from tests.support.chaos.wire import abort as _abort  # an RST, as a rejecting firewall sends

WATCH = "/v3/watch"
PASS, HOLD, REFUSE = "pass", "hold", "refuse"


@dataclass(frozen=True)
class Seen:
    """A request that reached the proxy: when (CLOCK_BOOTTIME), its path, what was done."""

    at: float
    path: str
    fault: str  # PASS, HOLD or REFUSE


class GatewayProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.seen: list[Seen] = []
        self.watched = bytearray()  # what the watch streams carried back, in order
        self._fault: Callable[[str], str] = lambda path: PASS
        self._delay: Callable[[str], float] = lambda path: 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._next: list[tuple[str, str, float]] = []  # one-shot: (path, fault, late)

    def start(self) -> GatewayProxy:
        self._thread.start()
        self._server = self._run(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        self._run(self._reset())
        assert self._server is not None
        self._server.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    # ---- faults: each replaces the last ----

    def fault(self, fault: str, paths: Collection[str]) -> None:
        """From now on, HOLD or REFUSE every request to one of ``paths``."""
        self._fault = lambda path: fault if path in paths else PASS

    def fault_all_but(self, fault: str, paths: Collection[str]) -> None:
        """HOLD or REFUSE every request but those to ``paths``: a partition that spares, say,
        the watch."""
        self._fault = lambda path: PASS if path in paths else fault

    def delay(self, seconds: float, paths: Collection[str]) -> None:
        """From now on, send every request to one of ``paths`` on ``seconds`` late."""
        self._delay = lambda path: seconds if path in paths else 0.0

    def fault_next(self, fault: str, path: str, late: float = 0.0) -> None:
        """The next request to ``path`` alone: HOLD or REFUSE it, or (PASS) send it on
        ``late`` seconds late; the requests after it, and those on other connections
        meanwhile, as before."""
        self._next.append((path, fault, late))

    def heal(self) -> None:
        """Fault nothing more (requests already held stay so: their clients gave up)."""
        self._fault = lambda path: PASS

    def cut(self) -> None:
        """Refuse every request, the watch too, and reset every open connection."""
        self._fault = lambda path: REFUSE
        self._run(self._reset())

    def delivered(self, text: str) -> bool:
        """Whether a watch stream carried ``text`` back to the daemon."""
        return text.encode() in self.watched

    def requests(self, path: str, since: float = 0.0, fault: str = "") -> list[Seen]:
        seen = [s for s in list(self.seen) if s.path == path and s.at >= since]
        return [s for s in seen if fault in ("", s.fault)]

    # ---- plumbing ----

    async def _reset(self) -> None:
        for writer in list(self._writers):
            _abort(writer)

    def _run(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _abort(writer)
            return
        self._writers.add(up_writer)
        watched: list[bytearray] = []  # this connection's watch stream, once it asks for one
        answers = asyncio.ensure_future(_pump(up_reader, writer, watched))
        try:
            await self._requests(reader, up_writer, watched)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            for w in (writer, up_writer):
                _abort(w)
                self._writers.discard(w)
            answers.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await answers

    async def _requests(
        self, reader: asyncio.StreamReader, up: asyncio.StreamWriter, watched: list[bytearray]
    ) -> None:
        """Pass each request on, or fault it (and the connection) for good."""
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode(errors="replace").split("?", 1)[0]
            body = await reader.readexactly(_content_length(head))
            fault, late = self._fault(path), self._delay(path)
            if (once := next((n for n in self._next if n[0] == path), None)) is not None:
                self._next.remove(once)
                fault, late = once[1], once[2]
            self.seen.append(Seen(boottime(), path, fault))
            if fault == HOLD:
                await reader.read()  # until the client gives up and closes
            if fault != PASS:
                return  # the caller resets the connection
            if late > 0:
                await asyncio.sleep(late)
            if path == WATCH:
                watched.append(self.watched)
            up.write(head + body)
            await up.drain()


async def _pump(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, watched: list[bytearray]
) -> None:
    with contextlib.suppress(OSError):
        while data := await src.read(65536):
            for stream in watched:
                stream += data
            dst.write(data)
            await dst.drain()
    _abort(dst)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0
