"""The real etcd backend (etcd/backend.py) on a model etcd: its gateway client is replaced by one
whose requests and watch streams travel a Link to the EtcdServer, and the clocks the backend
reads (CLOCK_MONOTONIC for its ages, the wall clock for heartbeat stamps) are its host's.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any
from unittest import mock

from leaderd.backends.base import BackendUnavailable, Candidate
from leaderd.backends.etcd import backend as etcd
from leaderd.backends.etcd import records as etcd_records
from leaderd.backends.etcd import state as etcd_state
from leaderd.backends.etcd import view as etcd_view
from leaderd.backends.etcd import watch as etcd_watch
from leaderd.backends.etcd.gateway import EtcdClient, EtcdSettings
from leaderd.backends.etcd.line import ReleaseLine

from .etcdserver import EtcdServer, b64
from .network import ELECTION, SERVER, Link
from .vloop import NodeClock

URL = "etcd://model:2379/?prefix=/leaderd/"
_KINDS = {"releasing the lease": "release", "granting the lease": "release"}


class ModelClient(EtcdClient):
    """The gateway client, talking to the model server over one Link."""

    def __init__(self, settings: EtcdSettings, server: EtcdServer, link: Link) -> None:
        super().__init__(settings)
        self.server, self.link = server, link
        self._last_at = 0.0  # when the stream's last message arrives: streams keep order

    async def call(self, path: str, body: dict[str, Any], timeout: float, doing: str) -> Any:
        kind = _KINDS.get(doing, path.rsplit("/", 1)[1])
        return await self.link.request(kind, lambda: self.server.handle(path, body), timeout)

    async def close(self) -> None:
        return None

    @asynccontextmanager
    async def stream(
        self, path: str, body: dict[str, Any], connect_timeout: float
    ) -> AsyncIterator[AsyncIterator[Any]]:
        """A watch stream; it may break (the backend resumes it from its revision) and its
        messages arrive late, in order."""
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        loop, broken = asyncio.get_running_loop(), False

        def push(message: dict[str, Any] | None) -> None:
            nonlocal broken
            if broken:
                return
            if self.link.rng.random() < self.link.faults.wake_drop:
                self.link.counts["watch_broken"] += 1
                message, broken = None, True  # a resume replays from its revision
            late = self.link.rng.random() < self.link.faults.wake_late
            delay = self.link.delay() + (self.link.rng.uniform(0, 1.0) if late else 0.0)
            self._last_at = max(self._last_at, loop.time() + delay)
            loop.call_at(self._last_at, queue.put_nowait, message, context=SERVER)

        watcher = self.server.watch(body["create_request"], push)
        try:
            yield _messages(queue)
        finally:
            self.server.watchers.remove(watcher)


async def _messages(queue: asyncio.Queue[dict[str, Any] | None]) -> AsyncIterator[Any]:
    while (message := await queue.get()) is not None:
        yield message


class ModelLine(ReleaseLine):
    """The release line on the model: its copy may land late or never be answered, and the
    client then sends the release again."""

    def __init__(self, client: ModelClient) -> None:
        super().__init__(None)
        self._model = client

    async def post(self, path: str, body: dict[str, Any], timeout: float, doing: str) -> Any:
        try:
            return await self._model.call(path, body, timeout, doing)
        except (BackendUnavailable, TimeoutError):
            return None


class ModelEtcdBackend(etcd.EtcdBackend):
    def __init__(self, server: EtcdServer, link: Link) -> None:
        super().__init__(EtcdSettings.from_url(URL))
        self._etcd = ModelClient(self._settings, server, link)
        self._line = ModelLine(self._etcd)
        self._watch = etcd_watch.PrefixWatch(self._etcd, self._prefix, self._on_event)


class EtcdWorld:
    """etcd:// semantics: the real backend on a model etcd, each host on its own clocks."""

    Backend = ModelEtcdBackend

    def __init__(self, loop: Any, rng: random.Random, tell: Callable[[str], None]) -> None:
        drift = 0.01 * 0.475
        self.server = EtcdServer(loop, rng.uniform(1 - drift, 1 + drift), tell)
        self._rng = random.Random(rng.random())

    def backend(self, name: str, link: Link, clock: NodeClock) -> etcd.EtcdBackend:
        return ModelEtcdBackend(self.server, link)

    def lease_until(self, candidate: Candidate, term: int) -> float:
        """Until when (virtual time) the leader key names this process with ``term``, by its
        lease's expiry as it stands; -inf if it does not."""
        kv = self.server.kvs.get(f"/leaderd/{ELECTION}/leader")
        if kv is None or kv.lease not in self.server.leases:
            return -math.inf
        holder = etcd_state.holder_of({"value": kv.value, "key": b64("leader")})
        if (holder.node_id, holder.instance, holder.term) != (
            candidate.node_id, candidate.instance, term):  # fmt: skip
            return -math.inf
        return self.server.leases[kv.lease].expires_at / self.server.rate

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Heartbeat stamps on the host's wall clock; the watch's back-off seeded."""
        with contextlib.ExitStack() as stack:
            for module in (etcd, etcd_view, etcd_records):
                if hasattr(module, "now"):
                    stack.enter_context(mock.patch.object(module, "now", _stamp))
            stack.enter_context(mock.patch.object(etcd_watch, "random", self._rng))
            yield


def _stamp() -> str:
    """etcd records.now(): the wall clock in milliseconds, on the host's clock (time.time is
    the running node's while a run lasts)."""
    return dt.datetime.fromtimestamp(time.time(), dt.UTC).isoformat(timespec="milliseconds")
