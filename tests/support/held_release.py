"""A release that lands after the next renewal (docs/algorithm.md, "A release in doubt"), for
process tests on a network backend: node-a leads through a fault proxy, node-b follows on a
direct connection. The proxy holds node-a's release well past the moment its engine gives
up on it, delivers it to the server, then cuts node-a off. Had node-a renewed the same term
and led in between, the late release would end or grant away its lease while it answered
"leader" until its deadline: two leaders, which the referee reports."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypedDict, TypeVar

from tests.support.chaos.proxy import FaultProxy
from tests.support.daemons import Daemon, short_tempdir, wait_for
from tests.support.referee import Referee
from tests.support.switchover import listed_as_standby

TTL, RENEW = 2.0, 0.5
# Past renew_interval (the engine gives up) and the renewal after it, within one ttl (an
# etcd reservation's own lease, granted just before its transaction, must still be alive).
HOLD = 3 * RENEW
T = TypeVar("T")


class Timing(TypedDict):
    """The timing keywords of a Daemon."""

    ttl: float
    renew_interval: float
    retry_interval: float


class ProxyThread:
    """A FaultProxy on its own event loop in a thread, for a test that drives processes."""

    def __init__(self, host: str, port: int) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.proxy = self.run(FaultProxy("node-a", host, port).start())

    def run(self, step: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(step, self.loop).result(timeout=30)

    # Each fault acts on the proxy's own loop, and is in effect when the call returns.
    def hold_next(self, pattern: bytes, seconds: float) -> None:
        self.run(_now(lambda: self.proxy.hold_next(pattern, seconds, then_blackhole=True)))

    def blackhole(self) -> None:
        self.run(_now(self.proxy.blackhole))

    def heal(self) -> None:
        self.run(_now(self.proxy.heal))

    def close(self) -> None:
        self.run(self.proxy.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def _now(act: Callable[[], None]) -> None:
    act()


@contextlib.contextmanager
def leader_behind_a_proxy(
    url: str, upstream: tuple[str, int], rewrite: tuple[str, str]
) -> Iterator[tuple[ProxyThread, Daemon, Daemon]]:
    """node-a leads on ``url`` with ``rewrite`` applied (pointing it at the proxy to
    ``upstream``), node-b follows on ``url`` itself."""
    proxied = ProxyThread(*upstream)
    workdir = short_tempdir()
    via_proxy = url.replace(rewrite[0], rewrite[1].format(port=proxied.proxy.port))
    assert via_proxy != url
    timing: Timing = {"ttl": TTL, "renew_interval": RENEW, "retry_interval": 0.25}
    a = Daemon("node-a", via_proxy, workdir=workdir, **timing).start()
    b = Daemon("node-b", url, workdir=workdir, **timing)
    try:
        a.wait_ready()
        wait_for(a.is_leader, timeout=10, what="node-a to lead")
        b.start().wait_ready()
        wait_for(lambda: b.get("/leader")[1]["leader"], timeout=10, what="node-b to follow")
        yield proxied, a, b
    finally:
        for d in (a, b):
            d.kill()
        proxied.close()
        subprocess.run(["rm", "-rf", workdir], check=False)


# How node-a resigns: its release grants the lease to node-b, or reserves it for node-b.
RESIGNS = ("cooldown=0", "to=node-b&cooldown=0")


def resign_with_the_release_held(
    proxied: ProxyThread, a: Daemon, b: Daemon, release: bytes, resign: str
) -> None:
    """node-a resigns (``resign``: the query, no cooldown); the proxy holds the first message
    that contains ``release``. The referee checks at-most-one-leader throughout; node-b ends
    up leading."""
    listed_as_standby(a, b.node_id, TTL)  # resign?to= names a live standby only
    term = a.get("/leader")[1]["term"]
    proxied.hold_next(release, HOLD)
    with Referee([a, b]) as referee:
        assert a.post(f"/resign?{resign}")[0] == 200
        proxied.run(proxied.proxy.held.wait())  # the release reached the server, late
        wait_for(b.is_leader, timeout=TTL * 3, what="node-b to lead")
        wait_for(lambda: not a.is_leader(), timeout=TTL * 2, what="node-a to step down")
        # The referee judges the new term too, not only the hand-over up to it.
        wait_for(lambda: max(referee.terms, default=0) > term, timeout=TTL,
                 what="the referee to see the new term")  # fmt: skip
    assert b.get("/leader")[1]["term"] > term
