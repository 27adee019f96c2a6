"""The API's connections: how many, for how long, and how they end.

aiohttp's server alone let hostile clients hold the daemon: no bound on connections or on
the time to send a request's headers, a listen backlog of 128 whatever was asked, a
traceback per malformed request, no answer to a client that half-closed its socket after
the request (aiohttp issue 3659), and, before aiohttp 3.9, handlers left running after
their client went away. Each connection here is an aiohttp ``RequestHandler`` that also:

- counts against its listener's ``max_connections`` and the daemon's open-file budget;
  a connection over either gets a 503 ``too_many_connections`` once its headers are in;
- must send a request's headers within ``header_timeout`` of connecting (or of its first
  byte after an answer), and is closed after ``keepalive_timeout`` with no request in
  progress; a request in progress (a long poll, a stream) is never timed out here;
- answers a request whose client shut down its write side, then closes;
- cancels its request's handler when the client is gone (a closed Unix socket is told
  apart from a half-closed one; on TCP the two look alike until a write fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import resource
import select
import socket
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .. import jsonio
from ..clock import boottime
from . import hot_paths

log = logging.getLogger("leaderd.http")

BACKLOG = 4096  # the kernel caps it at net.core.somaxconn (4096 since Linux 5.4)
_RESERVED_FILES = 64  # kept for the backend, the child's pipes, logs and listeners
_LOG_EVERY = 10.0  # seconds between two log lines about bad requests of one listener
_REJECT_WITHIN = 1.0  # an over-limit client gets its 503 after its headers, or this long
_SWEEP_EVERY = 1.0  # seconds between two looks at the connections' deadlines, at most
_TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int = 16384
    header_timeout: float = 10.0
    keepalive_timeout: float = 75.0


class FileBudget:
    """Open connections of every listener of a process, kept below its open-file limit so
    that clients cannot starve the daemon of files (a child it cannot start, a backend it
    cannot reach). Room is kept for a burst of connections accepted before they are
    refused: the kernel hands over up to a listen backlog at once."""

    def __init__(self, open_files: int | None = None) -> None:
        limit = open_files or resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.backlog = max(16, min(BACKLOG, limit // 4))
        self.capacity = max(1, limit - _RESERVED_FILES - self.backlog)
        self.open = 0


@dataclass
class Connections:
    """One listener's connections and what became of them (read by the metrics)."""

    listener: str
    limits: Limits = field(default_factory=Limits)
    budget: FileBudget = field(default_factory=FileBudget)
    open: int = 0
    rejected: dict[str, int] = field(
        default_factory=lambda: {"max_connections": 0, "open_files": 0}
    )
    timed_out: dict[str, int] = field(default_factory=lambda: {"header": 0, "idle": 0})
    bad_requests: int = 0
    _logged_at: float = -_LOG_EVERY
    _unlogged: int = 0
    # Every open connection. Each holds its own header or idle deadline, all looked at by
    # one sweep: a timer or a dict entry per request would be made and dropped around every
    # request (10,000 watchers answered at once).
    _live: set[Connection] = field(default_factory=set, repr=False)
    _sweep: asyncio.TimerHandle | None = field(default=None, repr=False)

    def enter(self, connection: Connection) -> None:
        self._live.add(connection)
        if self._sweep is None:
            self._schedule()

    def leave(self, connection: Connection) -> None:
        self._live.discard(connection)

    def _schedule(self) -> None:
        # get_running_loop() costs a getpid() system call: once a sweep, not per request.
        loop = asyncio.get_running_loop()
        self._sweep = loop.call_later(self._sweep_every(), self._expire_due)

    def _sweep_every(self) -> float:
        """A deadline is acted on at most this late: a quarter of the shortest timeout."""
        shortest = min(self.limits.header_timeout, self.limits.keepalive_timeout)
        return min(_SWEEP_EVERY, max(0.01, shortest / 4))

    def _expire_due(self) -> None:
        now = boottime()
        self._sweep = None
        for connection in [c for c in self._live if c.deadline <= now]:
            connection.deadline = math.inf
            connection.expire()
        if self._live:
            self._schedule()

    def refusal(self) -> str | None:
        """Why a new connection cannot be served now, or None."""
        if self.open >= self.limits.max_connections:
            return "max_connections"
        if self.budget.open >= self.budget.capacity:
            return "open_files"
        return None

    def bad_request(self, exc: BaseException, quiet: bool = False) -> None:
        """One line per listener every few seconds, however many clients misbehave
        (``quiet``: at debug level, for what aiohttp deems scanner noise)."""
        self.bad_requests += 1
        reason = " ".join(str(getattr(exc, "message", "") or exc).split())[:200]
        if quiet:
            log.debug("bad request on the %s listener: %s", self.listener, reason)
            return
        now = boottime()
        if now - self._logged_at < _LOG_EVERY:
            self._unlogged += 1
            return
        more = f" (and {self._unlogged} more since the last report)" if self._unlogged else ""
        log.warning("bad request on the %s listener: %s%s", self.listener, reason, more)
        self._logged_at, self._unlogged = now, 0


class _RequestLog:
    """The ``logger`` of every connection: malformed requests become one rate-limited
    line; a failure in leaderd's own handlers keeps its traceback."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    def exception(self, msg: str, *args: Any, exc_info: Any = True, **kw: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else None
        if isinstance(exc, HttpProcessingError):
            self._connections.bad_request(exc)
        else:
            log.error(msg, *args, exc_info=exc_info, **kw)

    def debug(self, msg: str, *args: Any, exc_info: Any = None, **kw: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):  # aiohttp: a scanner's bad method
            self._connections.bad_request(exc_info, quiet=True)
        else:
            log.debug(msg, *args, exc_info=exc_info, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(log, name)


_data_received = web.RequestHandler.data_received


class Connection(web.RequestHandler):
    """An aiohttp connection with leaderd's limits (see the module's docstring)."""

    # Like aiohttp's own: no __dict__, and the attributes read per request are slots.
    __slots__ = (
        "_busy",
        "_bytes",
        "_connections",
        "_headers_within",
        "_idle_for",
        "_timeout",
        "deadline",
    )

    def __init__(
        self, manager: web.Server, connections: Connections, dispatch: hot_paths.Routed, **kw: Any
    ) -> None:
        super().__init__(manager, **kw)
        self._request_handler = dispatch  # aiohttp's per-request hook (hot_paths.py)
        self._connections = connections
        self._timeout = "header"
        self._busy = False
        self._bytes = False  # bytes of a request not yet in progress
        self.deadline = math.inf  # of the header or idle timeout, on CLOCK_BOOTTIME
        # Read around every request: attributes of its own, not the limits' (hot path).
        self._headers_within = connections.limits.header_timeout
        self._idle_for = connections.limits.keepalive_timeout

    def request_started(self) -> None:
        """A request that waits (a long poll, a stream) is in progress: no deadline."""
        self._busy = True
        self._disarm()

    # ---- aiohttp's ----

    def log_access(self, request: Any, response: Any, started: float | None) -> None:
        """The answer is written: the request is over, the connection idle (aiohttp calls
        this once per request, whatever the handler did, so no wrapper around it is)."""
        self._busy = self._bytes = False
        if self.transport is not None:  # _arm("idle"), inlined: once per request
            self._timeout = "idle"
            self.deadline = boottime() + self._idle_for
        if self.access_logger is not None:
            super().log_access(request, response, started)

    # ---- asyncio protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._connections.open += 1
        self._connections.budget.open += 1
        self._arm("header", self._connections.limits.header_timeout)
        self._connections.enter(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        task = self._task_handler
        self._disarm()
        self._connections.leave(self)
        self._connections.open -= 1
        self._connections.budget.open -= 1
        super().connection_lost(exc)
        if task is not None and not task.done():
            task.cancel()  # the client is gone: so is its long poll or stream

    def data_received(self, data: bytes) -> None:
        if not self._bytes and not self._busy and data:  # _arm("header"), inlined
            self._bytes = True
            self._timeout = "header"
            self.deadline = boottime() + self._headers_within
        _data_received(self, data)  # aiohttp's, without a super() object per call

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio's contract: True keeps it open
        """The client shut down its write side: answer what it asked, then close."""
        if not (self._busy or self._bytes) or _peer_closed(self.transport):
            return False  # nothing to answer, or nobody to answer: close now
        self.close()  # aiohttp closes once the answer is written
        return True

    # ---- timeouts ----

    def _arm(self, timeout: str, seconds: float) -> None:
        self._timeout = timeout
        self.deadline = boottime() + seconds

    def _disarm(self) -> None:
        self.deadline = math.inf

    def expire(self) -> None:
        """Its header or idle deadline passed (called by the listener's sweep)."""
        if self._busy or self.transport is None:
            return
        self._connections.timed_out[self._timeout] += 1
        if self._timeout == "header" and self._bytes:
            self.transport.write(_TIMEOUT_408)
        self.force_close()


class _Refused(asyncio.Protocol):
    """A connection over the limit: read its headers (so the client is listening, not
    still writing), answer 503 and close. Nothing of it reaches aiohttp."""

    def __init__(self, connections: Connections, reason: str) -> None:
        self._connections = connections
        self._reason = reason
        self._transport: Any = None  # uvloop's transports are no asyncio.Transport
        self._tail = b""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._connections.rejected[self._reason] += 1
        wait = min(_REJECT_WITHIN, self._connections.limits.header_timeout)
        self._timer = asyncio.get_running_loop().call_later(wait, self._answer)

    def data_received(self, data: bytes) -> None:
        self._tail = (self._tail + data)[-8:]
        if b"\r\n\r\n" in self._tail or b"\n\n" in self._tail:
            self._answer()

    def eof_received(self) -> bool:
        self._answer()
        return True

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None

    def _answer(self) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._transport.write(_refusal(self._connections, self._reason))
        self._transport.close()


def _refusal(connections: Connections, reason: str) -> bytes:
    if reason == "max_connections":
        why = f"this listener serves at most {connections.limits.max_connections} connections"
    else:
        why = "the daemon is short of open files (raise LimitNOFILE or ulimit -n)"
    body = jsonio.dumps(
        {"error": {"code": "too_many_connections", "message": f"{why}; try again later"}}
    )
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _peer_closed(transport: asyncio.BaseTransport | None) -> bool:
    """True if a Unix socket's peer closed both directions (POLLHUP), not only its write
    side. A TCP peer's close looks like a half-close until a write fails: False."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family != socket.AF_UNIX:
        return False
    poller = select.poll()
    with contextlib.suppress(OSError, ValueError):
        poller.register(sock.fileno(), select.POLLIN)
        return any(events & select.POLLHUP for _, events in poller.poll(0))
    return True


def factory(runner: web.AppRunner, connections: Connections, **kwargs: Any) -> Any:
    """The protocol factory of one listener: a Connection, or a refusal over the limit."""
    server = runner.server
    assert server is not None, "call runner.setup() first"
    loop = asyncio.get_running_loop()
    logger = _RequestLog(connections)
    # aiohttp's own keep-alive timer only backs ours up.
    backstop = connections.limits.keepalive_timeout + connections.limits.header_timeout
    dispatch = hot_paths.dispatcher(runner.app, server.request_handler)

    def make() -> asyncio.Protocol:
        reason = connections.refusal()
        if reason is not None:
            return _Refused(connections, reason)
        return Connection(
            server,
            connections,
            dispatch,
            loop=loop,
            logger=logger,
            keepalive_timeout=backstop,
            **kwargs,
        )

    return make


class Site(web.BaseSite):
    """A listener whose connections are made by ``factory()`` with the backlog asked for
    (aiohttp's own sites call listen() again with theirs: 128 unless told)."""

    def __init__(
        self,
        runner: web.AppRunner,
        make: Any,
        *,
        sock: socket.socket | None = None,
        path: str | None = None,
        host: tuple[str, int] | None = None,
        backlog: int = BACKLOG,
        **kwargs: Any,
    ) -> None:
        super().__init__(runner, backlog=backlog, **kwargs)
        self._make, self._sock, self._path, self._host = make, sock, path, host

    @property
    def name(self) -> str:
        if self._host is not None:
            return f"http://{self._host[0]}:{self._host[1]}"
        path = self._path if self._sock is None else self._sock.getsockname()
        return f"http://unix:{path}:"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        if self._host is not None:
            host, port = self._host
            self._server = await loop.create_server(
                self._make, host, port, reuse_address=True, backlog=self._backlog
            )
        elif self._path is not None:
            self._server = await loop.create_unix_server(
                self._make, self._path, backlog=self._backlog
            )
        else:
            assert self._sock is not None
            self._server = await loop.create_server(
                self._make, sock=self._sock, backlog=self._backlog
            )
