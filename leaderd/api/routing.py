"""How the HTTP API's paths answer each method (docs/api.md, "Methods").

A path that answers GET answers HEAD and OPTIONS with the same handler, so the three give
the same status and headers (OPTIONS adds ``Allow``): a balancer that checks with
``option httpchk OPTIONS /leader``, as Patroni's recipes do, sees 503 on a follower.
A wrong method gets 405 with ``Allow``; an unknown path 404, whatever the method.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from aiohttp import web

from .. import jsonio
from .connections import Connection

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_JSON = "application/json"
# OPTIONS / is HAProxy's bare `option httpchk`: "is this listener there", nothing more.
_ROOT_ALLOW = "GET, HEAD, POST, OPTIONS"


def error(status: int, code: str, message: str) -> web.Response:
    body = jsonio.dumps({"error": {"code": code, "message": message}})
    return web.Response(body=body, status=status, content_type=_JSON)


def route_get(app: web.Application, path: str, handler: Handler) -> None:
    """``path`` answers GET, HEAD and OPTIONS alike with ``handler``."""
    allow = "GET, HEAD, OPTIONS"
    _route(app, path, {"GET": handler, "HEAD": handler, "OPTIONS": _allowing(handler, allow)})


def route_instant(app: web.Application, path: str, handler: Handler) -> None:
    """route_get with no wrapper around the handler: for an answer made at once (the hot
    /leader: the deadline its request's bytes armed lasts until it is written), or by a
    handler that calls waiting() itself before it waits (the long polls: no wrapper
    coroutine in each of 10,000 waits)."""
    allow = "GET, HEAD, OPTIONS"
    handlers = {"GET": handler, "HEAD": handler, "OPTIONS": _allowing(handler, allow)}
    _route(app, path, handlers, tracked=False)


def waiting(request: web.Request) -> None:
    """The request is about to wait (a long poll, a stream): no header or idle timeout for
    its connection until its answer is written (Connection.log_access)."""
    connection = request.protocol
    if isinstance(connection, Connection):  # not aiohttp's test server
        connection.request_started()


def route_post(app: web.Application, path: str, handler: Handler) -> None:
    """``path`` answers POST; OPTIONS only says so (there is no GET to answer like)."""
    allow = "POST, OPTIONS"
    _route(app, path, {"POST": handler, "OPTIONS": _options(allow)})


def route_get_post_delete(
    app: web.Application, path: str, get: Handler, post: Handler, delete: Handler
) -> None:
    """``path`` answers GET (and HEAD, OPTIONS, like it), POST and DELETE."""
    allow = "GET, HEAD, POST, DELETE, OPTIONS"
    handlers = {"GET": get, "HEAD": get, "POST": post, "DELETE": delete}
    _route(app, path, {**handlers, "OPTIONS": _allowing(get, allow)})


def route_fallback(app: web.Application, not_found: Handler) -> None:
    """Every other path: 404 for any method, but 200 with ``Allow`` for ``OPTIONS /``."""

    async def options(request: web.Request) -> web.StreamResponse:
        if request.path == "/":
            return web.Response(status=200, headers={"Allow": _ROOT_ALLOW})
        return await not_found(request)

    fallback = app.router.add_resource("/{path:.*}", name="fallback")
    fallback.add_route("OPTIONS", options)
    fallback.add_route("*", _tracked(not_found))


def api_routes(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves, without the error fallbacks and
    OPTIONS (which every path answers)."""
    routes = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter")
        if route.method not in ("*", "OPTIONS") and path is not None:
            routes.add((route.method, str(path)))
    return routes


def _route(
    app: web.Application, path: str, handlers: dict[str, Handler], tracked: bool = True
) -> None:
    resource = app.router.add_resource(path)
    for method, handler in handlers.items():
        resource.add_route(method, _tracked(handler) if tracked else handler)
    allow = ", ".join(handlers)

    async def method_not_allowed(request: web.Request) -> web.Response:
        message = f"{request.method} is not allowed on {path}; use {allow}"
        response = error(405, "method_not_allowed", message)
        response.headers["Allow"] = allow
        return response

    resource.add_route("*", _tracked(method_not_allowed))


def _tracked(handler: Handler) -> Handler:
    """``handler``, its request marked as waiting from the start."""

    @functools.wraps(handler)
    async def run(request: web.Request) -> web.StreamResponse:
        waiting(request)
        return await handler(request)

    return run


def _allowing(handler: Handler, allow: str) -> Handler:
    """The GET answer, with ``Allow`` added (the one header OPTIONS owes)."""

    async def options(request: web.Request) -> web.StreamResponse:
        response = await handler(request)
        response.headers["Allow"] = allow
        return response

    return options


def _options(allow: str) -> Handler:
    async def options(request: web.Request) -> web.Response:
        return web.Response(status=200, headers={"Allow": allow})

    return options
