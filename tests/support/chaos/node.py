"""One daemon of a chaos run, with its observers, its fault proxies, and what the harness
did to it."""

from __future__ import annotations

import asyncio
import time

from tests.support.daemons import Daemon

from .observe import Observations, Poller, Watcher
from .proxy import FaultProxy, RuleBook
from .settings import Settings


class Node:
    """A daemon with its observers, its proxies (PostgreSQL: one; etcd: one per member), the
    rules they share, and what the harness did to it."""

    def __init__(
        self,
        daemon: Daemon,
        proxy: FaultProxy | None,
        obs: Observations,
        s: Settings,
        proxies: list[FaultProxy] | None = None,
    ):
        self.id = daemon.node_id
        self.daemon = daemon
        self.proxy = proxy
        self.proxies = proxies if proxies is not None else [proxy] if proxy else []
        self.rules = self.proxies[0].rules if self.proxies else RuleBook()
        self.poller = Poller(self.id, daemon.socket, obs, s.poll_interval)
        self.watcher = Watcher(self.id, daemon.socket, obs)
        self.down = False  # killed or terminated by the harness, restart pending
        self.stopped = False  # SIGSTOPped
        self.busy = False  # a network fault is on its link
        self.started = 0.0  # harness monotonic time of the last (re)start

    @property
    def available(self) -> bool:
        # Answered since its last start: a signal never lands before its handlers are in.
        last = self.poller.last
        answered = last is not None and last.received >= self.started
        return answered and not (self.down or self.stopped or self.busy) and self.daemon.alive()

    async def exited(self, timeout: float) -> int | None:
        """The exit code once the process is gone; None if it still runs after ``timeout``."""
        proc = self.daemon.proc
        assert proc is not None
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.005)
        return proc.returncode
