"""The model's own parts: virtual time, host clocks, pauses, and the model etcd."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from .etcdserver import EtcdServer, b64, text
from .vloop import NODE, NodeClock, VirtualLoop

pytestmark = pytest.mark.model


def _node(loop: VirtualLoop, name: str, rate: float) -> contextvars.Context:
    context = contextvars.Context()
    context.run(NODE.set, name)
    loop.rates[name] = rate
    return context


def _sleep_once(rate: float, pause: tuple[float, float] | None) -> tuple[float, float]:
    """A host sleeps one second of its own clock (paused over ``pause``, virtual times):
    the virtual time and its clock's reading when it wakes."""
    loop = VirtualLoop()
    clock = NodeClock(loop, rate=rate, offset=1000.0, wall_offset=0.0)
    woke: list[tuple[float, float]] = []

    async def host() -> None:
        await asyncio.sleep(1.0)
        woke.append((loop.time(), clock.now()))

    async def main() -> None:
        task = loop.create_task(host(), context=_node(loop, "a", rate))
        if pause is not None:
            await asyncio.sleep(pause[0])
            loop.pause("a")
            await asyncio.sleep(pause[1] - pause[0])
            loop.resume("a")
        await task

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return woke[0]


def test_a_host_sleeps_on_its_own_clock() -> None:
    assert _sleep_once(0.5, None) == (pytest.approx(2.0), pytest.approx(1001.0))


def test_a_paused_host_runs_nothing_until_it_resumes() -> None:
    assert _sleep_once(1.0, (0.5, 2.5)) == (pytest.approx(2.5), pytest.approx(1002.5))


def test_a_suspend_stops_the_monotonic_clock_only() -> None:
    loop = VirtualLoop()
    clock = NodeClock(loop, rate=1.0, offset=0.0, wall_offset=0.0)

    async def main() -> None:
        clock.suspend()
        await asyncio.sleep(3.0)
        clock.wake()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert (clock.now(), clock.monotonic()) == (pytest.approx(3.0), pytest.approx(0.0))


def test_etcd_a_range_sees_the_puts_before_it_and_an_expiry_deletes_in_one_revision() -> None:
    loop = VirtualLoop()
    server = EtcdServer(loop, rate=1.0, tell=lambda _: None)
    seen: list[object] = []
    watch = {"key": b64("/p/"), "range_end": b64("/p0")}
    server.watch(watch, seen.append)
    lease = int(server.grant(5)["ID"])
    put = {"key": b64("/p/a"), "value": b64("1"), "lease": lease}
    answer = server.txn(
        {"success": [{"request_put": put}, {"request_range": {"key": b64("/p/a")}}]}
    )
    (kv,) = answer["responses"][1]["response_range"]["kvs"]
    assert (text(kv["value"]), kv["mod_revision"]) == ("1", answer["header"]["revision"])

    async def main() -> None:
        await asyncio.sleep(5.0)

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert "/p/a" not in server.kvs and server.timetolive(lease)["TTL"] == "-1"
    deleted = seen[-1]["result"]["events"]  # type: ignore[index]
    assert [event["type"] for event in deleted] == ["DELETE"]
