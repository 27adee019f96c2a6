"""One etcd watch over the backend's key prefix, shared by all its elections: standbys wake
on the event of a release, an expiry or an acquisition instead of polling.

The stream (``POST /v3/watch``) resumes from the revision after the last event it
delivered, so a reconnect misses nothing; a resume from a revision etcd has compacted away
cannot, so it is said in one line and every waiter is woken to read again. The stream runs
on the client's preferred endpoint and moves when the requests move (a member that stopped
answering them would leave it silent); a member that loses its raft leader ends it itself.
While it is down a wait is a plain sleep, and the engine's rounds poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any

from ..base import BackendError, BackendUnavailable
from .errors import answer_error
from .gateway import EtcdClient, b64, prefix_end, unb64

log = logging.getLogger("leaderd.backends.etcd")

# (key, kv or None when deleted, revision) -> the election the key belongs to, or None.
OnEvent = Callable[[str, "dict[str, Any] | None", int], "str | None"]

_CONNECT_TIMEOUT = 5.0
_MIN_BACKOFF, _MAX_BACKOFF = 0.1, 2.0


class _Compacted(Exception):
    """The revision to resume from is gone; start again from the present."""


class PrefixWatch:
    def __init__(self, client: EtcdClient, prefix: str, on_event: OnEvent) -> None:
        self._etcd = client
        self._prefix = prefix
        self._on_event = on_event
        self.watching = False
        self._live = asyncio.Event()  # set while a created stream runs
        self._from = 0  # the next revision to deliver; 0: from the present
        self._heard: dict[str, int] = {}  # revision of the newest event, by election
        self._events: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None
        self._stream: asyncio.Task[None] | None = None
        self._backoff = _MIN_BACKOFF
        self._moving = False
        self._last_error = ""
        client.on_move = self._move

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="leaderd-etcd-watch"
            )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.watching = False
        for event in self._events.values():
            event.set()

    def heard(self, election: str) -> int:
        return self._heard.get(election, 0)

    async def created(self, within: float) -> None:
        """Until the stream is created, or ``within`` seconds: a read made after it then
        shows all its start could tell, and the start is no news to a wait."""
        self.start()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._live.wait()

    async def wait(self, election: str, answered: int, timeout: float) -> None:
        """Until an event newer than revision ``answered`` concerns ``election``, the watch
        stops, or timeout. A wake-up at or before ``answered`` (a stream created before the
        read that answered, a delivery lagging it) told nothing new: the wait goes on."""
        self.start()
        event = self._events.setdefault(election, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, timeout)):
                while self.heard(election) <= answered and self._task is not None:
                    event.clear()
                    await event.wait()

    def restart(self) -> None:
        """End the current stream; the next one resumes where it stopped, at once."""
        if self._stream is not None and not self._stream.done():
            self._moving = True
            self._stream.cancel()

    def _move(self) -> None:
        self._backoff = _MIN_BACKOFF
        self.restart()

    # ---- the stream ----

    async def _run(self) -> None:
        while True:
            self._stream = asyncio.get_running_loop().create_task(self._follow())
            try:
                await self._stream  # cancelling this task cancels the stream too
            except asyncio.CancelledError:
                if not self._moving:
                    raise
                self._moving = False
                continue
            except _Compacted:
                continue
            except BackendError as exc:
                self._failed(str(exc))
            self.watching = False
            await asyncio.sleep(self._backoff * random.uniform(0.5, 1.0))
            self._backoff = min(self._backoff * 2, _MAX_BACKOFF)

    def _failed(self, reason: str) -> None:
        self.watching = False
        self._etcd.avoid(self._etcd.endpoint)
        if reason != self._last_error:
            log.warning(
                "etcd watch of %s: %s; standbys poll until it is back", self._prefix, reason
            )
        self._last_error = reason

    async def _follow(self) -> None:
        # Progress notifications (every 10 min by default) move the resume point through quiet
        # times, so a reconnect after etcd compacted old revisions need not start over.
        request: dict[str, Any] = {"key": b64(self._prefix), "range_end": prefix_end(self._prefix),
                                   "progress_notify": True}  # fmt: skip
        if self._from:
            request["start_revision"] = self._from
        try:
            async with self._etcd.stream(
                "/v3/watch", {"create_request": request}, _CONNECT_TIMEOUT
            ) as messages:
                async for message in messages:
                    self._handle(message)
        finally:
            self.watching = False
            self._live.clear()
        raise BackendUnavailable(f"{self._etcd.host}: the member ended the watch")

    def _handle(self, message: Any) -> None:
        if "error" in message:
            raise answer_error(self._etcd.host, 200, message)
        result = message.get("result", {})
        compacted = int(result.get("compact_revision", 0))
        if compacted:
            log.warning(
                "etcd watch of %s: revision %d was compacted (etcd keeps %d and later); "
                "every election reads its lease again",
                self._prefix,
                self._from,
                compacted,
            )
            self._from = 0
            raise _Compacted
        if result.get("canceled"):
            reason = result.get("cancel_reason") or "by etcd"
            if "auth token" in reason:
                self._etcd.logout()  # expired: the next stream logs in again
            raise BackendUnavailable(f"watch canceled: {reason}")
        revision = int(result.get("header", {}).get("revision", 0))
        if result.get("created"):
            self._created(revision)
        elif not result.get("events") and self._from:  # progress: all events up to revision
            self._from = max(self._from, revision + 1)
        for event in result.get("events", ()):
            kv = event.get("kv", {})
            revision = int(kv.get("mod_revision", 0))
            key = unb64(kv.get("key", "")).decode(errors="replace")
            election = self._on_event(key, None if event.get("type") == "DELETE" else kv, revision)
            self._from = max(self._from, revision + 1)
            if election is not None:
                self._wake(election, revision)

    def _created(self, revision: int) -> None:
        self.watching, self._backoff = True, _MIN_BACKOFF
        self._live.set()
        if self._last_error:
            log.info("etcd watch of %s is back", self._prefix)
            self._last_error = ""
        if not self._from:  # from the present: whatever happened before is unknown
            self._from = revision + 1
            for election in list(self._events):
                self._wake(election, revision)

    def _wake(self, election: str, revision: int) -> None:
        self._heard[election] = max(self.heard(election), revision)
        event = self._events.get(election)
        if event is not None:
            event.set()
