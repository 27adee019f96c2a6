"""One clock for leadership (docs/algorithm.md), on the etcd backend: a spare lease ages on
CLOCK_BOOTTIME, so after a host suspend it looks as old as etcd's lessor knows it is.

A host suspend is emulated in this test process: real seconds pass (etcd's lessor counts
them, and CLOCK_BOOTTIME does) while CLOCK_MONOTONIC is then held back by as much, as a
suspended kernel's would be. libfaketime would move CLOCK_BOOTTIME with CLOCK_MONOTONIC, so
a daemon process cannot be given this clock pair; the backend is driven here directly, on
the real 3-member cluster."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest

from leaderd.clock import boottime
from tests.backends.etcd.test_grant import A, B, Cluster, E, cluster
from tests.support.backend_calls import ask, release

__all__ = ["cluster"]

TTL = 4.0  # the spare: a lease of 4 s in etcd
SUSPENDED = 2.0  # past a quarter of the spare: no longer fresh, not yet expired


def hold_monotonic_back(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """From now on CLOCK_MONOTONIC, as this process reads it, is ``seconds`` behind: it did
    not count them, as in a suspend. CLOCK_BOOTTIME runs on."""
    real: Callable[[], float] = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: real() - seconds)


def lessor_expiry(cluster: Cluster) -> float:
    """When etcd's lessor expires the leader key's lease at the latest, on CLOCK_BOOTTIME:
    it counts whole seconds, so one more."""
    _, kv = cluster.etcd.get(f"{cluster.prefix}{E}/leader")
    out = cluster.etcd.etcdctl("lease", "timetolive", format(int(kv["lease"]), "x"), "-w", "json")
    return boottime() + float(json.loads(out)["ttl"]) + 1.0


async def test_an_acquisition_after_a_suspend_counts_its_spare_as_old_as_etcd_does(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = await cluster.open(), await cluster.open()
    held = await ask(a, E, A, ttl=TTL, timeout=5)
    await ask(b, E, B, ttl=TTL, timeout=5)  # B's first round grants its spare
    await release(a, E, A, held.term)  # free: B's next round acquires under that spare
    await asyncio.sleep(SUSPENDED)  # the host sleeps...
    hold_monotonic_back(monkeypatch, SUSPENDED)  # ...and CLOCK_MONOTONIC did not count it
    try:
        won = await ask(b, E, B, ttl=TTL, timeout=5)
        answered = boottime()
        assert won.held_by(B) and won.expires_in is not None
        expiry = lessor_expiry(cluster)
    finally:
        await b.close()  # before the clock is put back: its timers were set on the held one
        await a.close()
    # The engine leads until its t_send plus that: never past etcd's expiry of the key.
    assert answered + won.expires_in <= expiry, (won.expires_in, expiry - answered)
