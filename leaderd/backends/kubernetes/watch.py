"""One watch per election's Lease (``?watch=1&fieldSelector=metadata.name=NAME``): a standby
wakes on the event of a release or an acquisition within milliseconds instead of polling.

Each event hands the object to ``on_event`` (which remembers when this process first saw
that resourceVersion: the takeover clock) and wakes the election's waiters. The stream
resumes from the last resourceVersion it delivered; a resume the server no longer has (410
Gone) starts again from the present and wakes every waiter to read. While it is down a wait
is a plain sleep, and the engine's rounds poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import urllib.parse
from collections.abc import Callable
from typing import Any

from ..base import BackendError
from .transport import KubeClient

log = logging.getLogger("leaderd.backends.kubernetes")

# (election, the Lease object, or None once deleted) -> whether it is news to the backend
OnEvent = Callable[[str, "dict[str, Any] | None"], bool]
_MIN_BACKOFF, _MAX_BACKOFF = 0.1, 2.0
_WATCH_SECONDS = 300  # the server ends a watch after this; it resumes at once


class _Gone(Exception):
    """The resourceVersion to resume from is too old: read again from the present."""


class LeaseWatch:
    def __init__(self, client: KubeClient, leases_path: str, on_event: OnEvent) -> None:
        self._client = client
        self._path = leases_path
        self._on_event = on_event
        self._names: dict[str, str] = {}  # election -> Lease name
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._heard: dict[str, int] = {}  # events received, by election
        self._events: dict[str, asyncio.Event] = {}
        self.watching: dict[str, bool] = {}

    def start(self, election: str, name: str) -> None:
        if election not in self._tasks:
            self._names[election] = name
            loop = asyncio.get_running_loop()
            self._tasks[election] = loop.create_task(
                self._run(election), name=f"leaderd-kube-watch-{election}"
            )

    async def stop(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for event in self._events.values():
            event.set()

    def heard(self, election: str) -> int:
        return self._heard.get(election, 0)

    async def wait(self, election: str, answered: int, timeout: float) -> None:
        """Until an event after the ``answered``-th concerns ``election``, or timeout."""
        if self.heard(election) > answered:
            return
        event = self._events.setdefault(election, asyncio.Event())
        event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(0.0, timeout))

    async def _run(self, election: str) -> None:
        since, backoff, last_error = "", _MIN_BACKOFF, ""
        while True:
            try:
                since = await self._follow(election, since)
            except _Gone:
                since = ""
                continue
            except BackendError as exc:
                self.watching[election] = False
                if str(exc) != last_error:
                    log.warning(
                        "kubernetes watch of election %s: %s; standbys poll until it is back",
                        election,
                        exc,
                    )
                last_error = str(exc)
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, _MAX_BACKOFF)
                continue
            backoff = _MIN_BACKOFF
            if last_error:
                log.info("kubernetes watch of election %s is back", election)
                last_error = ""

    async def _follow(self, election: str, since: str) -> str:
        """One watch request, until the server ends it; the resourceVersion to resume from.
        Without one, a list gives the present and the version to watch from (a watch from
        "now" needs a storage feature this API server may lack)."""
        selector = urllib.parse.quote(f"metadata.name={self._names[election]}")
        if not since:
            since = await self._list(election, selector)
        query = (
            f"?watch=1&fieldSelector={selector}&allowWatchBookmarks=true"
            f"&timeoutSeconds={_WATCH_SECONDS}&resourceVersion={since}"
        )
        try:
            # The server ends each watch after _WATCH_SECONDS and sends bookmarks meanwhile:
            # a stream silent for longer is dead, and is replaced.
            async with self._client.stream(self._path + query, _WATCH_SECONDS + 30) as events:
                self.watching[election] = True
                async for event in events:
                    since = self._handle(election, event) or since
        finally:
            self.watching[election] = False
        return since

    async def _list(self, election: str, selector: str) -> str:
        """The Lease as it is now (every waiter woken to read it); the list's version."""
        answer = await self._client.request("GET", f"{self._path}?fieldSelector={selector}", 10.0)
        items = [i for i in answer.body.get("items") or () if isinstance(i, dict)]
        if self._on_event(election, items[0] if items else None):
            self._wake(election)
        return str((answer.body.get("metadata") or {}).get("resourceVersion", ""))

    def _handle(self, election: str, event: Any) -> str:
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(obj, dict):
            return ""
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone
            raise BackendError(f"watch error {obj.get('code')}: {obj.get('message', '')}"[:300])
        version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if kind == "BOOKMARK":
            return version
        if self._on_event(election, None if kind == "DELETED" else obj):
            self._wake(election)
        return version

    def _wake(self, election: str) -> None:
        self._heard[election] = self.heard(election) + 1
        event = self._events.get(election)
        if event is not None:
            event.set()
