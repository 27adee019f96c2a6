"""LISTEN/NOTIFY: how standbys hear of acquisitions and releases at once.

One dedicated connection per backend LISTENs on the table's channel. While it is down
nobody is woken and standbys poll; an outage is logged when it starts, every five minutes
while it lasts (with counts), and when it ends, never once per reconnect attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import logging
import random
from collections.abc import Callable
from typing import Any

import asyncpg
import orjson

from ..clock import boottime
from ..events import Event, extra
from .base import BackendError, Grant, Lease
from .pgconn import connect, request
from .pgsettings import PgSettings

log = logging.getLogger("leaderd.backends.postgresql")

CANCEL = "SELECT pg_cancel_backend($1)"


def notify_channel(table: str) -> str:
    """The NOTIFY channel of a table: ``leaderd_<table>`` (an identifier: <= 63 bytes)."""
    channel = f"leaderd_{table}"
    if len(channel) > 63:
        channel = "leaderd_" + hashlib.sha256(table.encode()).hexdigest()[:32]
    return channel


class Listener:
    """A dedicated connection that LISTENs on a channel and wakes the elections named in
    the payloads, ``"<term> acquired|released <election>"``, and keeps the grants that
    ``"<term> granted <json>"`` payloads carry (docs/algorithm.md, "One-write hand-over").

    A wake-up counts only if it tells of a newer state than the last request saw
    (``saw``): acquired T < released T < acquired T+1. While the connection is down
    nobody wakes anyone, so a ``wait`` is a plain sleep (polling); it reconnects with
    backoff, and wakes every waiter on each change of connection state.
    """

    PING = 30.0  # seconds between liveness checks of the idle connection

    def __init__(self, settings: PgSettings, channel: str) -> None:
        self._pg = settings
        self.channel = channel
        self.listening = False
        self._events: dict[str, asyncio.Event] = {}
        self._notified: dict[str, int] = {}  # newest state announced, per election
        self._seen: dict[str, int] = {}  # state the last request saw, per election
        self._grants: dict[str, Grant] = {}  # the newest grant announced, per election
        # Per election: (the term a waiter knows, its event), set on newer "acquired" news.
        self._acquired: dict[str, tuple[int, asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._conn: Any = None  # while listening
        self._up = asyncio.Event()
        self.outage = Outage(f"LISTEN {channel} on {settings.description}")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"leaderd-{self.channel}")

    async def ready(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the first LISTEN to be in place."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._up.wait(), timeout)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.wake_all()

    def saw(self, election: str, term: int, held: bool) -> None:
        """A request saw this state: forget announcements it already covers."""
        seen = self._seen[election] = _state(term, held)
        grant = self._grants.get(election)
        if grant is not None and _state(grant.lease.term, True) <= seen:
            del self._grants[election]  # old news: the request saw that term or a later one
        event = self._event(election)
        if self._notified.get(election, -1) > seen:
            event.set()
        else:
            event.clear()

    def wake(self, election: str) -> None:
        self._event(election).set()

    def wake_all(self) -> None:
        for event in self._events.values():
            event.set()

    def _event(self, election: str) -> asyncio.Event:
        return self._events.setdefault(election, asyncio.Event())

    async def wait(self, election: str, timeout: float) -> Grant | None:
        """Wait for news of ``election``; the grant it carried, if any (told once)."""
        event = self._event(election)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(0.0, timeout))
            # Told once: a wake-up that no request follows up (backend down) must not
            # turn every later wait into a spin.
            event.clear()
            return self._grants.pop(election, None)
        return None

    async def acquired(self, election: str, after_term: int, timeout: float) -> bool:
        """True when another node announces, within ``timeout``, that it acquired
        ``election`` with a term above ``after_term``. An announcement of a term the caller
        already knows (a NOTIFY delivered late) is old news and does not count."""
        event = asyncio.Event()
        self._acquired[election] = (after_term, event)
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await event.wait()
        except TimeoutError:
            return False
        finally:
            if self._acquired.get(election, (0, None))[1] is event:
                del self._acquired[election]
        return True

    async def cancel(self, pid: int, timeout: float) -> bool:
        """Cancel the statement that server process ``pid`` runs, over this connection: no
        new server process, unlike asyncpg's CancelRequest. False when not listening, busy
        (a ping) or failed: the caller then closes that session instead."""
        conn = self._conn
        if conn is None or not self.listening:
            return False
        try:
            return bool(await conn.fetchval(CANCEL, pid, timeout=timeout))
        except (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError,
                OSError, TimeoutError):  # fmt: skip
            return False

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        term, kind, election = [*payload.split(" ", 2), "", ""][:3]
        if kind == "granted" and term.isdigit():
            self._on_grant(int(term), election)
            return
        if not term.isdigit() or kind not in ("acquired", "released"):
            return
        waiting = self._acquired.get(election)
        if kind == "acquired" and waiting is not None and int(term) > waiting[0]:
            waiting[1].set()
        state = _state(int(term), kind == "acquired")
        if state > self._notified.get(election, -1):
            self._notified[election] = state
        if state > self._seen.get(election, -1) and election in self._events:
            self._events[election].set()

    def _on_grant(self, term: int, text: str) -> None:
        """Keep a grant (any process's: each checks whether it names its own instance)."""
        try:
            grant = _grant(term, orjson.loads(text))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.debug("ignored a malformed grant on %s: %.200r", self.channel, text)
            return
        election = grant.lease.election
        if _state(term, True) > self._seen.get(election, -1):
            self._grants[election] = grant
            if election in self._events:
                self._events[election].set()

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                await self._listen()
                self.outage.failed("the connection was lost")
                backoff = 0.1
            except BackendError as exc:
                self.outage.failed(str(exc))
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, 5.0)

    async def _listen(self) -> None:
        """LISTEN until the connection is lost (return) or fails (BackendError)."""
        conn = await connect(self._pg, self._pg.connect_timeout, writer=False)
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())
        try:
            async with request(self._pg, "listening"):
                await conn.add_listener(self.channel, self._on_notify)
                self._conn, self.listening = conn, True
                self.outage.ended()
                self.wake_all()  # changes made while nobody listened were not heard
                self._up.set()
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), self.PING)
                        break
                    await conn.execute("SELECT 1", timeout=5.0)
        finally:
            self._conn = None
            conn.terminate()
            if self.listening:
                self.listening = False
                self.wake_all()  # from now on waiters poll: let them re-read at once


class Outage:
    """Logs a run of failures as a story of a few lines, not one line per retry: a warning
    when it starts, a summary every ``every`` seconds while it lasts, one line at its end."""

    def __init__(
        self, what: str, every: float = 300.0, clock: Callable[[], float] = boottime
    ) -> None:
        self.what = what
        self.every = every
        self._clock = clock
        self.failures = 0
        self._started: float | None = None
        self._summarized = 0.0
        self._last = ""

    @property
    def ongoing(self) -> bool:
        return self._started is not None

    def failed(self, reason: str) -> None:
        now = self._clock()
        self.failures += 1
        self._last = reason
        if self._started is None:
            self._started = self._summarized = now
            log.warning(
                "%s: %s; standbys poll until it is back",
                self.what,
                reason,
                extra=extra(Event.LISTEN_DOWN, reason=reason),
            )
        elif now - self._summarized >= self.every:
            self._summarized = now
            log.warning(
                "%s: still down after %.0fs, %d failed attempts; last: %s",
                self.what,
                now - self._started,
                self.failures,
                reason,
                extra=extra(Event.LISTEN_DOWN, reason=reason, failures=self.failures),
            )

    def ended(self) -> None:
        if self._started is None:
            return
        log.info(
            "%s: back after %.1fs and %d failed attempts (last: %s)",
            self.what,
            self._clock() - self._started,
            self.failures,
            self._last,
            extra=extra(Event.LISTEN_UP, failures=self.failures),
        )
        self._started, self.failures = None, 0


def _grant(term: int, data: dict[str, Any]) -> Grant:
    """The Grant a "granted" payload describes (postgres.py, _RELEASE). Its lease expires
    ``ttl`` after ``heard_at``: expires_in counts from the heartbeat, as base.Grant says."""
    lease = Lease(
        str(data["election"]),
        str(data["holder"]),
        str(data["address"]),
        term,
        dt.datetime.fromisoformat(data["acquired_at"]),
        float(data["ttl"]),
        instance=str(data["instance"]),
        version=str(data["version"]),
    )
    return Grant(lease, dt.datetime.fromisoformat(data["heard_at"]))


def _state(term: int, held: bool) -> int:
    """Orders what a lease can show: held with T < free after T < held with T + 1."""
    return 2 * term + (0 if held else 1)
