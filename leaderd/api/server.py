"""The local HTTP API (docs/api.md): reads the engines' state, never touches a backend.

Every answer is derived at the moment it is produced (``Election.status()``). There is no
middleware on the hot path: routing.py maps each path's methods to these handlers (HEAD
and OPTIONS answer like GET), with fallback routes for the errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
from collections.abc import Coroutine
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CONTENT_TYPE_LATEST

from .. import jsonio, package_files
from ..election import switchover
from ..election.answers import EncodedStatus
from ..election.engine import Election
from ..election.history import DEFAULT_LIMIT, MAX_LIMIT
from ..election.node import Node
from ..election.status import ElectionStatus, Role
from . import hot_paths, params, switchover_api
from .connections import Connections, Site, factory
from .jobs import jobs_body
from .metrics import Metrics
from .routing import (
    Handler,
    error,
    route_fallback,
    route_get,
    route_instant,
    route_post,
    waiting,
)

DEFAULT_WATCH_TIMEOUT = 30.0
# Proxies and load balancers cut streams idle for 30-60 s; a heartbeat keeps them open.
STREAM_HEARTBEAT = 15.0
MAX_WATCH_TIMEOUT = 300.0
MAX_COOLDOWN = 86400.0
_JSON = "application/json"
_NDJSON = "application/x-ndjson"
_SSE = "text/event-stream"
_LEADER = Role.LEADER  # read per /leader answer: Python 3.11 looks enum members up slowly

T = TypeVar("T")


# aiohttp 3.8 (Debian 12) takes the shutdown timeout on each site, later ones on the runner.
_AIOHTTP_39 = tuple(int(part) for part in aiohttp.__version__.split(".")[:2]) >= (3, 9)


def build_app(
    node: Node,
    *,
    read_only: bool = False,
    metrics: Metrics | None = None,
    heartbeat: float = STREAM_HEARTBEAT,
) -> web.Application:
    """The API of one node. ``read_only`` answers 403 to every POST (the TCP listener).

    Pass the daemon's shared ``metrics`` to every app; without one, a private Metrics
    watching ``node`` is made (fine for a single app, e.g. in tests). A /watch stream
    sends a heartbeat after ``heartbeat`` seconds without a change.
    """
    if metrics is None:
        metrics = Metrics()
        metrics.watch(node)
    api = _Api(node, metrics, read_only, heartbeat)
    app = web.Application(client_max_size=64 * 1024)
    app.on_shutdown.append(api.on_shutdown)
    default = node.election(None)  # the elections are fixed: found once, not per answer
    if default is None:
        route_instant(app, "/leader", api.leader)  # it answers which election to name
    else:
        leader = _leader_of(default)
        route_instant(app, "/leader", leader)
        hot_paths.mark(app, "/leader", leader)  # it never reads the request's route
    route_instant(app, "/leader/{election}", api.leader)
    for name, election in node.elections.items():  # names need no escaping in a path
        hot_paths.mark(app, f"/leader/{name}", _leader_of(election))
    for tail in ("", "/{election}"):
        route_instant(app, "/watch" + tail, api.watch)  # it calls waiting() itself
    get: list[tuple[str, Handler]] = [
        ("/standby", api.standby),
        ("/members", api.members),
        ("/history", api.history),
        ("/jobs", api.jobs),
    ]
    for path, handler in get:
        for tail in ("", "/{election}"):
            route_get(app, path + tail, handler)
    node_paths: list[tuple[str, Handler]] = [
        ("/status", api.status),
        ("/health", api.health),
        ("/ready", api.ready),
        ("/metrics", api.metrics),
        ("/openapi.json", api.openapi),
    ]
    for path, handler in node_paths:
        route_get(app, path, handler)
    for path in ("/resign", "/resign/{election}"):
        route_post(app, path, api.forbidden if read_only else api.resign)
    for path in ("/switchover", "/switchover/{election}"):
        change = api.forbidden if read_only else api.switchover
        switchover_api.route(app, path, api.switchover, change)
    route_fallback(app, api.not_found)
    return app


async def serve(
    app: web.Application,
    *,
    unix_path: str | None = None,
    unix_sock: socket.socket | None = None,
    tcp: tuple[str, int] | None = None,
    shutdown_timeout: float = 5.0,
    connections: Connections | None = None,
) -> web.AppRunner:
    """Serve ``app`` on the given listeners; stop with ``await runner.cleanup()``.

    ``unix_sock`` is a bound, listening (or listen-ready) socket the daemon made itself
    (socket activation, stale-socket handling); ``unix_path`` makes one. ``connections``
    bounds and counts the listeners' connections (see connections.py); without one, the
    default limits apply.
    """
    if unix_path is None and unix_sock is None and tcp is None:
        raise ValueError("serve() needs at least one listener")
    connections = connections or Connections("unix" if tcp is None else "tcp")
    options: dict[str, Any] = {}
    site_options: dict[str, Any] = {"backlog": connections.budget.backlog}
    if _AIOHTTP_39:
        options["shutdown_timeout"] = shutdown_timeout
    else:
        site_options["shutdown_timeout"] = shutdown_timeout
    runner = web.AppRunner(app, access_log=None, **options)
    await runner.setup()
    make = factory(runner, connections, access_log=None)
    sites = [
        Site(runner, make, **where, **site_options)
        for where in ({"sock": unix_sock}, {"path": unix_path}, {"host": tcp})
        if next(iter(where.values())) is not None
    ]
    try:
        for site in sites:
            await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def _json(data: Any, status: int = 200, revision: int | None = None) -> web.Response:
    response = web.Response(body=jsonio.dumps(data), status=status, content_type=_JSON)
    if revision is not None:
        response.headers["Leaderd-Revision"] = str(revision)
    return response


class _Api:
    def __init__(self, node: Node, metrics: Metrics, read_only: bool, heartbeat: float) -> None:
        self.node = node
        self.heartbeat = heartbeat
        self.metrics_ = metrics
        self.read_only = read_only
        self.closing = asyncio.Event()
        self.openapi_body = package_files.read_bytes("openapi.json")

    async def on_shutdown(self, app: web.Application) -> None:
        # Long polls answer and streams end now, instead of holding up the shutdown.
        self.closing.set()
        for election in self.node.elections.values():
            election.end_long_polls()

    # ---- the election endpoints ----

    async def leader(self, request: web.Request) -> web.Response:
        election = self.node.election(request.match_info.get("election"))
        if election is None:
            return self._unknown(request)
        return await _leader(election, request)

    async def standby(self, request: web.Request) -> web.Response:
        """Patroni's /replica: 200 while this node is a healthy follower that knows the
        leader, so reads can be routed to standbys; 503 otherwise (leader, unknown...)."""
        election = self.node.election(request.match_info.get("election"))
        if election is None:
            return self._unknown(request)
        status = election.status()
        follows = status.role is Role.FOLLOWER and status.leader is not None
        code = 200 if follows and self.node.health() is None else 503
        return _json(status.to_dict(), code, status.revision)

    async def watch(self, request: web.Request) -> web.StreamResponse:
        election = self.node.election(request.match_info.get("election"))
        if election is None:
            return self._unknown(request)
        try:
            query = request.query
            revision = params.revision(query.get("revision"))
            timeout = params.seconds(
                query.get("timeout"), "timeout", DEFAULT_WATCH_TIMEOUT, MAX_WATCH_TIMEOUT
            )
            stream = params.flag(query.get("stream"), "stream")
        except params.BadParameter as exc:
            return error(400, "bad_parameter", str(exc))
        if request.method != "GET":  # HEAD and OPTIONS answer at once, never a stream
            return _answer(election.encoded_status())
        accept = request.headers.get("Accept", "")
        if stream or _SSE in accept:
            sse = _SSE in accept or query.get("stream") == "sse"
            waiting(request)
            return await self._stream(request, election, sse)
        if self.closing.is_set():  # shutting down: no new wait
            return _answer(election.encoded_status())
        waiting(request)
        # Awaited here, in the handler's task: no helper task per long poll (10,000 add up).
        return _answer(await election.wait_for_answer(revision, timeout))

    async def resign(self, request: web.Request) -> web.Response:
        election = self.node.election(request.match_info.get("election"))
        if election is None:
            return self._unknown(request)
        try:
            # By default wait one ttl, so a standby (not this node) takes over.
            default = election.timing.ttl
            cooldown = params.seconds(
                request.query.get("cooldown"), "cooldown", default, MAX_COOLDOWN
            )
            to = params.node_id(request.query.get("to"), "to")
        except params.BadParameter as exc:
            return error(400, "bad_parameter", str(exc))
        given = "cooldown" in request.query
        refused = switchover.refusal(election, self.node.node_id, to, cooldown_given=given)
        if refused is not None:
            return error(refused.status, refused.code, refused.message)
        election.resign(cooldown, to)
        status = election.status()
        return _json(status.to_dict(), revision=status.revision)

    async def members(self, request: web.Request) -> web.Response:
        election = self.node.election(request.match_info.get("election"))
        if election is None:
            return self._unknown(request)
        return _json(election.members().to_dict())

    async def history(self, request: web.Request) -> web.Response:
        election = self.node.election(request.match_info.get("election"))
        if election is None:
            return self._unknown(request)
        try:
            limit = params.count(request.query.get("limit"), "limit", DEFAULT_LIMIT, MAX_LIMIT)
        except params.BadParameter as exc:
            return error(400, "bad_parameter", str(exc))
        return _json(election.history().to_dict(limit))

    async def switchover(self, request: web.Request) -> web.Response:
        election = self.node.election(request.match_info.get("election"))
        return switchover_api.answer(election, request) if election else self._unknown(request)

    async def jobs(self, request: web.Request) -> web.Response:
        election = self.node.election(request.match_info.get("election"))
        return _json(jobs_body(self.node, election.name)) if election else self._unknown(request)

    async def forbidden(self, request: web.Request) -> web.Response:
        message = f"this listener is read-only: {request.method} on the Unix socket"
        return error(403, "read_only", message)

    # ---- the node endpoints ----

    async def status(self, request: web.Request) -> web.Response:
        return _json(self.node.describe())

    async def health(self, request: web.Request) -> web.Response:
        reason = self.node.health()
        if reason is not None:
            return error(503, "unhealthy", reason)
        return _json({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        why = self.node.not_ready()
        if why is not None:
            return error(503, "not_ready", why)
        return _json({"status": "ready"})

    async def metrics(self, request: web.Request) -> web.Response:
        body = self.metrics_.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def openapi(self, request: web.Request) -> web.Response:
        return web.Response(body=self.openapi_body, content_type=_JSON)

    async def not_found(self, request: web.Request) -> web.Response:
        return error(404, "not_found", f"no such path: {request.path}")

    # ---- helpers ----

    def _unknown(self, request: web.Request) -> web.Response:
        name = request.match_info.get("election")
        if name is None:
            known = ", ".join(sorted(self.node.elections)) or "none"
            message = f"several elections run here ({known}): name one, e.g. /leader/NAME"
        else:
            message = f"unknown election {name!r}"
        return error(404, "unknown_election", message)

    async def _unless_closing(
        self, work: Coroutine[Any, Any, T], timeout: float | None = None
    ) -> T | None:
        """The result of ``work``, or None if the daemon shuts down (or ``timeout``
        passes) first."""
        if self.closing.is_set():
            work.close()
            return None
        task = asyncio.ensure_future(work)
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            await asyncio.wait(
                (task, closing), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            closing.cancel()
            if not task.done():
                # Also on client disconnect: the watch must unregister before we return.
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return task.result() if task.done() and not task.cancelled() else None

    async def _stream(
        self, request: web.Request, election: Election, sse: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": _SSE if sse else _NDJSON, "Cache-Control": "no-cache"}
        )
        with election.stream() as queue:
            try:
                await response.prepare(request)
                await self._send_events(response, queue, sse)
                await response.write_eof()
            except ConnectionResetError:
                pass  # the client left before an event: nobody to tell
        return response

    async def _send_events(
        self, response: web.StreamResponse, queue: asyncio.Queue[ElectionStatus], sse: bool
    ) -> None:
        while True:
            status = await self._unless_closing(queue.get(), self.heartbeat)
            if status is None and not self.closing.is_set():
                # SSE: a comment; NDJSON: an empty line. Also finds a client gone.
                await response.write(b": keep-alive\n\n" if sse else b"\n")
                continue
            if status is None:
                return
            await response.write(_event(status, sse))
            if status.role is Role.STOPPED:
                return


@functools.lru_cache(maxsize=16)
def _headers(revision: int) -> CIMultiDictProxy[str]:
    """A status answer's headers, made once per revision: each Response copies them (from
    a proxy, which nothing can change), and thousands of answers share a revision."""
    return CIMultiDictProxy(CIMultiDict({"Content-Type": _JSON, "Leaderd-Revision": str(revision)}))


async def _leader(election: Election, request: web.Request) -> web.Response:
    """GET /leader: judged now, like every answer; only its encoding is reused."""
    answer = election.encoded_status()
    code = 200 if answer.role is _LEADER else 503
    return web.Response(body=answer.body, status=code, headers=_headers(answer.revision))


def _leader_of(election: Election) -> Handler:
    """_leader bound to ``election``: a partial, so the hot path has no frame around it."""
    return functools.partial(_leader, election)


def _answer(answer: EncodedStatus, status: int = 200) -> web.Response:
    return web.Response(body=answer.body, status=status, headers=_headers(answer.revision))


def _event(status: ElectionStatus, sse: bool) -> bytes:
    data = jsonio.dumps(status.to_dict())
    if sse:
        return b"id: %d\nevent: status\ndata: %s\n\n" % (status.revision, data)
    return data + b"\n"
