"""Per-request faults of the chaos harness, on every network backend: the daemon's fault
proxies (tests/support/chaos/proxy.py) act on one kind of request (etcd: by the gateway's path;
PostgreSQL: by statement) while the rest of its traffic flows.

* ``request_delay``: every request (or delivery) of one kind waits 0.05 s-2 renew_interval,
  or stalls until the heal; for 0.5 s-2.5 ttl;
* ``request_drop``: the next request of one kind never reaches the server; its connection
  goes silent, and is cut 0-renew_interval later;
* ``answer_lost``: the next request of one kind reaches the server, which applies it; its
  answer is lost and the connection cut;
* ``request_late``: the next request of one kind reaches the server 1.5 renew_interval-2 ttl
  late, long after the client gave up;
* ``partition`` (etcd): nothing passes between the daemon and any member, as long as
  ``sigstop``.

A release happens only when a leader steps down, so when a one-shot fault draws the release
kind (PostgreSQL ``release``, etcd ``delete``) it aims at the leader and asks it to resign
(``POST /resign?cooldown=0``) once armed; a LISTEN is sent once per connection, so one drawn
for it resets the daemon's connections once armed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from typing import TYPE_CHECKING

from . import http_requests, pg_messages
from .proxy import DELAY, DROP, LATE, LOSE_ANSWER, Rule

if TYPE_CHECKING:
    from .check import Fault
    from .node import Node
    from .settings import Settings

REQUEST_FAULTS = ("request_delay", "request_drop", "answer_lost", "request_late")
_KINDS = {"etcd": http_requests.KINDS, "pg": pg_messages.KINDS}
# Kinds the server answers to a request (a one-shot fault needs one); watch and notify are
# deliveries, which only a delay acts on.
_DELIVERIES = ("watch", "notify")
_RELEASES = ("release", "delete")
_AT_CONNECT = ("listen",)


class RequestFaults:
    """Mixed into the harness's Chaos: per-request faults through each node's proxies."""

    s: Settings
    rng: random.Random

    if TYPE_CHECKING:

        def _node(self, fault: Fault) -> Node: ...
        def _pause(self) -> float: ...

    def _request_kinds(self, one_shot: bool, leader: bool) -> tuple[str, ...]:
        kinds = _KINDS["etcd" if self.s.backend == "etcd" else "pg"]
        if one_shot:
            kinds = tuple(k for k in kinds if k not in _DELIVERIES)
            if not leader:
                kinds = tuple(k for k in kinds if k not in _RELEASES)
        return kinds

    def _draw(self, node: Node, kinds: tuple[str, ...]) -> str:
        """Half the time any kind, half the time as often as the daemon sends each (a rare
        request would rarely come while a one-shot fault waits for it)."""
        weights = [node.rules.seen.get(kind, 0) for kind in kinds]
        if self.rng.random() < 0.5 or not any(weights):
            return self.rng.choice(kinds)
        return self.rng.choices(kinds, weights)[0]

    async def _fault_request_delay(self, fault: Fault) -> None:
        node = self._node(fault)
        kind = self.rng.choice(self._request_kinds(False, fault.target_role == "leader"))
        stall = self.rng.random() < 0.5
        each = math.inf if stall else round(self.rng.uniform(0.05, 2 * self.s.renew_interval), 3)
        hold = round(self.rng.uniform(0.5, 2.5 * self.s.ttl), 3)
        fault.params.update(request=kind, each_s=None if stall else each, held_s=hold)
        node.busy = True
        node.rules.arm(kind, Rule(DELAY, each))
        seen = node.rules.seen.get(kind, 0)
        await asyncio.sleep(hold)
        node.rules.end(kind)
        fault.params["requests_delayed"] = node.rules.seen.get(kind, 0) - seen
        node.busy, fault.healed = False, time.monotonic()

    async def _fault_request_drop(self, fault: Fault) -> None:
        cut = round(self.rng.uniform(0, self.s.renew_interval), 3)
        await self._one_shot(fault, Rule(DROP, cut), cut)

    async def _fault_answer_lost(self, fault: Fault) -> None:
        await self._one_shot(fault, Rule(LOSE_ANSWER), 0.0)

    async def _fault_request_late(self, fault: Fault) -> None:
        late = round(self.rng.uniform(1.5 * self.s.renew_interval, 2 * self.s.ttl), 3)
        await self._one_shot(fault, Rule(LATE, late), late)

    async def _one_shot(self, fault: Fault, rule: Rule, after: float) -> None:
        """Arm ``rule`` for one drawn kind of request; wait until it fires (a resign asks for
        a release) and has done its harm, or 2 ttl without such a request."""
        node = self._node(fault)
        kind = self._draw(node, self._request_kinds(True, fault.target_role == "leader"))
        fault.params.update(request=kind, seconds=rule.seconds)
        node.busy = True
        node.rules.arm(kind, rule)
        if kind in _RELEASES:
            fault.params["resign_status"] = await node.poller.post("/resign?cooldown=0")
        if kind in _AT_CONNECT:  # sent once per connection: have it sent again
            fault.params["connections_reset"] = sum(p.reset() for p in node.proxies)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rule.fired.wait(), 2 * self.s.ttl)
        fault.params["fired"] = rule.fired.is_set()
        node.rules.end(kind)
        if rule.fired.is_set():
            fault.injected = rule.fired_at
            await asyncio.sleep(max(0.0, rule.fired_at + after - time.monotonic()))
        node.busy, fault.healed = False, time.monotonic()

    async def _fault_partition(self, fault: Fault) -> None:
        """Nothing passes between the daemon and any of its backend's endpoints."""
        node = self._node(fault)
        fault.params["held_s"] = hold = round(self._pause(), 3)
        node.busy = True
        for proxy in node.proxies:
            proxy.blackhole()
        await asyncio.sleep(hold)
        for proxy in node.proxies:
            proxy.heal()
        node.busy, fault.healed = False, time.monotonic()
