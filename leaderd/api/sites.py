"""Where the API is served: the read-write API on the Unix socket, and the read-only one on
every TCP listener (socket-activated, else ``--listen``). Each kind of listener has its own
connection limits; all share one open-file budget."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence

from aiohttp import web

from ..election.node import Node
from .connections import Connections, FileBudget, Limits
from .listener import SocketPathError
from .metrics import Metrics
from .server import build_app, serve

log = logging.getLogger("leaderd")


class Sites:
    """The listeners of one daemon. ``served`` is told of each one as soon as it serves, so
    that its teardown is registered even when a later one fails."""

    def __init__(
        self, node: Node, metrics: Metrics, limits: Limits, served: Callable[[web.AppRunner], None]
    ) -> None:
        self._node, self._metrics, self._limits, self._served = node, metrics, limits, served
        self._budget: FileBudget | None = None

    async def open(
        self,
        unix: socket.socket,
        activated: Sequence[socket.socket],
        listen: tuple[str, int] | None,
    ) -> None:
        """Serve on ``unix``, and read-only on the activated TCP sockets, else ``listen``.
        Raises SocketPathError when ``listen`` cannot be bound."""
        app = build_app(self._node, metrics=self._metrics)
        self._served(await serve(app, unix_sock=unix, connections=self._connections("unix")))
        tcp = [s for s in activated if s.family in (socket.AF_INET, socket.AF_INET6)]
        if not (tcp or listen):
            return
        read_only = build_app(self._node, metrics=self._metrics, read_only=True)
        tcp_conns = self._connections("tcp")
        for sock in tcp:
            self._served(await serve(read_only, unix_sock=sock, connections=tcp_conns))
        if listen and not tcp:
            try:
                self._served(await serve(read_only, tcp=listen, connections=tcp_conns))
            except OSError as exc:
                host, port = listen
                raise SocketPathError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
            log.info("read-only listener on %s:%d", *listen)

    def _connections(self, listener: str) -> Connections:
        if self._budget is None:
            self._budget = FileBudget()
            log.debug("open connections at most %d (open files)", self._budget.capacity)
        connections = Connections(listener, self._limits, self._budget)
        self._metrics.watch_connections(connections)
        return connections
