"""Faults dealt to PostgreSQL and to the daemons' links to it.

* ``pg_restart``, ``pg_crash`` (no checkpoint, with synchronous_commit=off): the server
  goes down and comes back;
* ``clock_step``: the server's clock jumps forward (libfaketime);
* ``pg_terminate``: the target's backends are terminated;
* ``latency``, ``blackhole``, ``reset``: the target's fault proxy delays, swallows or cuts
  its traffic.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import asyncpg

from tests.support.pgserver import FakeTimeServer, PgServer

from .proxy import FaultProxy
from .settings import CLOCK_STEP

if TYPE_CHECKING:
    from .check import Fault
    from .node import Node


class PostgresFaults:
    """Mixed into the harness's Chaos."""

    rng: random.Random
    pg: PgServer | None
    clock_offset: int

    if TYPE_CHECKING:

        def _node(self, fault: Fault) -> Node: ...
        def _pause(self) -> float: ...

    async def _fault_pg_crash(self, fault: Fault) -> None:
        """PostgreSQL dies without a checkpoint (pg_ctl -m immediate) while its default is
        synchronous_commit=off: commits not yet written are lost, unless leaderd's lease
        statements commit durably (docs/postgresql.md)."""
        assert self.pg is not None
        await asyncio.to_thread(self.pg.stop, "immediate")
        fault.params["down_s"] = down = round(self.rng.uniform(0.1, 1.0), 3)
        await asyncio.sleep(down)
        await asyncio.to_thread(self.pg.start)
        fault.healed = time.monotonic()

    async def _fault_clock_step(self, fault: Fault) -> None:
        """The server's clock steps forward (an NTP jump): every lease expires early on
        the server, and only the one-ttl takeover rule keeps a renewing leader's lease."""
        if not isinstance(self.pg, FakeTimeServer):
            return  # a shared server without libfaketime: nothing to step
        self.clock_offset += CLOCK_STEP
        fault.params["server_clock_offset_s"] = self.clock_offset
        await asyncio.to_thread(self.pg.step, self.clock_offset)
        fault.healed = time.monotonic()

    async def _fault_pg_restart(self, fault: Fault) -> None:
        assert self.pg is not None
        await asyncio.to_thread(self.pg.restart)
        fault.healed = time.monotonic()

    async def _fault_pg_terminate(self, fault: Fault) -> None:
        assert self.pg is not None
        conn = await asyncpg.connect(self.pg.dsn(), timeout=5)
        try:
            killed = await conn.fetchval(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                " FROM pg_stat_activity WHERE application_name = $1",
                f"leaderd-{fault.target}",
            )
        finally:
            await conn.close()
        fault.params["backends_terminated"] = killed

    async def _fault_latency(self, fault: Fault) -> None:
        delay, hold = round(self.rng.uniform(0.05, 0.8), 3), round(self.rng.uniform(0.5, 3), 3)
        fault.params.update(delay_s=delay, held_s=hold)
        await self._on_link(fault, lambda proxy: setattr(proxy, "delay", delay), hold)

    async def _fault_blackhole(self, fault: Fault) -> None:
        fault.params["held_s"] = hold = round(self._pause(), 3)
        await self._on_link(fault, FaultProxy.blackhole, hold)

    async def _on_link(
        self, fault: Fault, break_: Callable[[FaultProxy], None], hold: float
    ) -> None:
        """Break the link between the target and PostgreSQL for ``hold`` seconds."""
        node = self._node(fault)
        assert node.proxy is not None
        node.busy = True
        break_(node.proxy)
        await asyncio.sleep(hold)
        node.proxy.heal()
        node.busy, fault.healed = False, time.monotonic()

    async def _fault_reset(self, fault: Fault) -> None:
        node = self._node(fault)
        assert node.proxy is not None
        fault.params["connections_reset"] = node.proxy.reset()
