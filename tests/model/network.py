"""The network between a node and a model server, and the faults it injects per request.

A request reaches the server after a delay (in the server's context, so a paused node does
not stop it), is applied there atomically, and its answer travels back. A fault may drop the
request, lose the answer after the server applied it, stall the request so that the server
applies it after the client gave up, or hold the answer past the client's timeout. Wake-ups
(NOTIFY, watch events) travel the same way and may be delayed, reordered or dropped.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from leaderd.backends.base import BackendError, BackendUnavailable

from .vloop import server_context

T = TypeVar("T")
SERVER = server_context()
ELECTION = "model"  # the one election every run contests


@dataclass(frozen=True)
class Faults:
    """Probabilities per request (or per wake-up), and the network's mean one-way delay."""

    latency: float = 0.002
    drop: float = 0.01  # the request never reaches the server
    lose_answer: float = 0.02  # applied; the answer is lost (connection reset)
    stall: float = 0.02  # held on the way: applied after the client gave up on it
    # A release applied after its sender gave up and renewed (a release in doubt).
    stalled_release: float = 0.02
    slow_answer: float = 0.02  # applied; the answer arrives after the client gave up
    cache: float = 0.05  # the backend answers from its last answer, with no request
    late_failure: float = 0.02  # the answer reached the backend, the round failed after it
    wake_drop: float = 0.1
    wake_late: float = 0.2  # a wake-up held up to a second: they arrive out of order


FAULTS = Faults()
CLEAN = Faults(0.001, 0, 0, 0, 0, 0, 0, 0, 0, 0)


class Link:
    """One node's connection to one model server."""

    def __init__(self, rng: random.Random, faults: Faults, counts: Counter[str]) -> None:
        self.rng = rng
        self.faults = faults
        self.counts = counts
        # A scripted fate for the next request of a kind (named cases), else a random one.
        self.script: dict[str, list[str]] = {}

    def delay(self) -> float:
        return self.rng.expovariate(1 / self.faults.latency)

    def scripted(self, kind: str) -> str | None:
        """The next scripted fate of a request of ``kind``, if a named case set one."""
        script = self.script.get(kind)
        return script.pop(0) if script else None

    def chance(self, kind: str, p: float) -> bool:
        """A fault that is scripted for ``kind`` as "yes", or that happens with ``p``."""
        scripted = self.scripted(kind)
        hit = scripted == "yes" if scripted is not None else self.rng.random() < p
        if hit:
            self.counts[kind] += 1
        return hit

    def fate(self, kind: str) -> str:
        scripted = self.scripted(kind)
        if scripted is not None:
            return scripted
        f, roll = self.faults, self.rng.random()
        stall = f.stalled_release if kind == "release" else f.stall
        for fate, p in (("drop", f.drop), ("lose_answer", f.lose_answer), ("stall", stall),
                        ("slow_answer", f.slow_answer)):  # fmt: skip
            if roll < p:
                self.counts[fate] += 1
                return fate
            roll -= p
        return "ok"

    async def request(self, kind: str, apply: Callable[[], T], timeout: float) -> T:
        """``apply`` on the server, as the network and the faults let it; its answer."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        fate, go = self.fate(kind), self.delay()
        if fate.startswith("stall"):  # "stall:2.5" holds it exactly that long
            _, _, held = fate.partition(":")
            go += float(held) if held else self.rng.uniform(timeout / 2, 3 * timeout)
        if fate != "drop":
            loop.call_later(go, self._serve, apply, answer, fate, timeout, context=SERVER)
        try:
            async with asyncio.timeout(timeout):
                return await answer
        except TimeoutError:
            raise BackendUnavailable(f"{kind}: timed out after {timeout:.3g}s (model)") from None

    def _serve(
        self, apply: Callable[[], T], answer: asyncio.Future[T], fate: str, timeout: float
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            result: T | BackendError = apply()
        except BackendError as exc:
            result = exc
        if fate == "lose_answer":
            result = BackendUnavailable("connection reset after the server applied it (model)")
        back = self.delay() + (
            self.rng.uniform(timeout, 2 * timeout) if fate == "slow_answer" else 0
        )
        loop.call_later(back, _settle, answer, result, context=SERVER)

    def wake(self, deliver: Callable[[], None]) -> None:
        """Deliver a wake-up (in the server's context), unless it is dropped; maybe late."""
        f = self.faults
        if self.rng.random() < f.wake_drop:
            self.counts["wake_dropped"] += 1
            return
        delay = self.delay()
        if self.rng.random() < f.wake_late:
            self.counts["wake_late"] += 1
            delay += self.rng.uniform(0, 1.0)
        asyncio.get_running_loop().call_later(delay, deliver, context=SERVER)


def _settle(answer: asyncio.Future[T], result: T | BackendError) -> None:
    if answer.done():
        return
    if isinstance(result, BackendError):
        answer.set_exception(result)
    else:
        answer.set_result(result)
