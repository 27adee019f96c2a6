"""The paths answered before aiohttp's router: a GET of ``/leader`` (or of
``/leader/NAME``) goes straight to its election's handler.

Every request through a ``web.Application`` is resolved by its router: a coroutine, a
match-info object built and frozen, the app's response signals looked up. For the path that
load balancers and gates poll thousands of times a second that was about a seventh of an
answer's CPU, for an answer that never depends on it (docs/benchmarks.md, "HTTP").
Every other request, and any other method or a query string on a hot path (HEAD, OPTIONS,
405 and 404 alike), goes through the router as before: the routes stay the one place that
says what a path answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Routed = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]

# aiohttp 3.9 and later warn about a str key; Debian 12's aiohttp (3.8) has no AppKey.
HOT: Any = web.AppKey("leaderd_hot_paths", dict) if hasattr(web, "AppKey") else "leaderd_hot_paths"


def mark(app: web.Application, path: str, handler: Handler) -> None:
    """Answer a plain ``GET path`` with ``handler``, before the router (which routes the
    same handler for it, for every request not taken here)."""
    app.setdefault(HOT, {})[path] = handler


def dispatcher(app: web.Application, routed: Routed) -> Routed:
    """The request handler of the app's connections: a hot path's GET to its handler,
    everything else to ``routed`` (the app's own, through its router)."""
    hot: dict[str, Routed] = app.get(HOT, {})  # Handlers: the app makes web.Requests
    if not hot:
        return routed

    def dispatch(request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
        handler = hot.get(request.raw_path)  # the request line's target, as sent
        if handler is None or request.method != "GET":
            return routed(request)
        return handler(request)

    return dispatch
