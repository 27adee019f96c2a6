"""A standby's first wait on etcd: the start of the watch stream is no change.

A backend's watch stream starts when the backend opens; its creation wakes every wait it
finds, since whatever happened before it is unknown. A wait that begins after a read made
since the stream's start has nothing to learn from that start. When the stream started
later than the first read (a slow member, a busy host), the standby's first wait ended at
once, for nothing: an extra round, and in the contract tests a "change" that never was.
Forced here with a proxy that sends the watch request on late (gateway_proxy.py).
"""

from __future__ import annotations

import uuid

from leaderd.backends import Backend, backend_from_url
from leaderd.clock import boottime
from tests.backends.etcd.gateway_proxy import WATCH, GatewayProxy

E = "default"
SLOW_START = 0.5  # seconds the proxy holds the watch request back
WAIT = 1.5  # the standby's wait: nothing changes in it


async def test_a_watch_that_starts_late_wakes_no_standby_that_read_since(
    proxy: GatewayProxy, opened: list[Backend]
) -> None:
    proxy.delay(SLOW_START, [WATCH])
    standby = backend_from_url(
        f"etcd://127.0.0.1:{proxy.port}/?prefix=/leaderd-test/{uuid.uuid4().hex[:10]}/"
    )
    opened.append(standby)
    await standby.open([E])
    await standby.observe(E)
    began = boottime()
    await standby.wait_for_change(E, WAIT)
    waited = boottime() - began
    assert proxy.requests(WATCH), "the watch went through the proxy"
    assert waited >= WAIT - 0.05, f"the stream's start woke the standby after {waited:.2f}s"
