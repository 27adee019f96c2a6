"""What both PostgreSQL backends share: URL parsing, connecting, and error translation."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import re
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from . import redact_url
from .base import BackendError, BackendFatal, BackendUnavailable

log = logging.getLogger("leaderd.backends.postgresql")

# Query parameters leaderd reads itself; every other one goes to asyncpg, which takes
# the libpq connection parameters it knows and sends the rest as server settings (GUCs).
_OWN_PARAMS = ("table", "schema", "application_name", "connect_timeout", "takeover")
# Advisory backend: after an unreleased holder, wait out its lease, or take over at once.
TAKEOVER_MODES = ("wait", "immediate")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

# SQLSTATE classes that retrying cannot fix: bad credentials (28), no such database (3D)
# or schema (3F), privileges/undefined objects/syntax (42), bad parameter values (22).
_FATAL_CLASSES = ("28", "3D", "3F", "42", "22")


# Everything asyncpg may raise for a failed request; InternalClientError (a protocol state
# error after the server went away mid-statement) derives from neither of the others.
DRIVER_ERRORS = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)


@dataclass(frozen=True)
class PgSettings:
    """A parsed ``postgresql[+advisory]://`` URL."""

    dsn: str  # for asyncpg only: never logged
    description: str  # redacted, safe to log and serve
    schema: str
    table: str
    application_name: str
    connect_timeout: float
    takeover: str = "wait"
    secrets: tuple[str, ...] = field(default=(), repr=False)

    @property
    def qualified_table(self) -> str:
        return f'"{self.schema}"."{self.table}"'

    @classmethod
    def from_url(cls, url: str, default_table: str) -> PgSettings:
        description = redact_url(url)
        try:
            parts = urllib.parse.urlsplit(url)
            query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        except ValueError as exc:
            raise BackendFatal(f"invalid PostgreSQL URL {description}") from exc
        own = {k: v for k, v in query if k in _OWN_PARAMS}
        rest = [(k, v) for k, v in query if k not in _OWN_PARAMS]
        schema = own.get("schema", "public")
        table = own.get("table", default_table)
        for what, name in (("schema", schema), ("table", table)):
            if not _IDENTIFIER.fullmatch(name):
                raise BackendFatal(
                    f"{description}: {what} {name!r} is not a plain identifier "
                    "(letters, digits, _; at most 63 characters)"
                )
        try:
            connect_timeout = float(own.get("connect_timeout", "10"))
        except ValueError:
            raise BackendFatal(f"{description}: connect_timeout must be a number") from None
        takeover = own.get("takeover", "wait")
        if takeover not in TAKEOVER_MODES:
            raise BackendFatal(f"{description}: takeover must be wait or immediate")
        secrets = [v for k, v in query if k == "password" and v]
        if parts.password:
            secrets += [parts.password, urllib.parse.unquote(parts.password)]
        dsn = urllib.parse.urlunsplit(
            ("postgresql", parts.netloc, parts.path, urllib.parse.urlencode(rest), "")
        )
        return cls(
            dsn=dsn,
            description=description,
            schema=schema,
            table=table,
            application_name=own.get("application_name", "leaderd"),
            connect_timeout=connect_timeout if connect_timeout > 0 else 10.0,
            takeover=takeover,
            secrets=tuple(sorted(set(secrets), key=len, reverse=True)),
        )

    def scrub(self, text: str) -> str:
        """Remove any password from a driver message (belt and braces)."""
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text.replace(self.dsn, self.description)

    def error(self, exc: BaseException, doing: str) -> BackendError:
        """Translate a driver or socket exception into the backend's own, redacted."""
        if isinstance(exc, BackendError):
            return exc
        reason = self.scrub(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        message = f"{doing} on {self.description}: {reason}"
        sqlstate = getattr(exc, "sqlstate", None) or ""
        fatal = sqlstate[:2] in _FATAL_CLASSES or isinstance(
            exc, asyncpg.ClientConfigurationError | asyncpg.UnsupportedServerFeatureError
        )
        return BackendFatal(message) if fatal else BackendUnavailable(message)

    async def connect(self, timeout: float, server_settings: dict[str, str]) -> Any:
        """Open one connection within ``timeout`` seconds (and ``connect_timeout``)."""
        settings = {"application_name": self.application_name, **server_settings}
        try:
            async with asyncio.timeout(min(timeout, self.connect_timeout)):
                return await asyncpg.connect(
                    self.dsn,
                    server_settings=settings,
                    statement_cache_size=20,
                    command_timeout=None,
                )
        except TimeoutError:
            raise BackendUnavailable(
                f"connecting to {self.description}: timed out after "
                f"{min(timeout, self.connect_timeout):.3g}s"
            ) from None
        except DRIVER_ERRORS as exc:
            raise self.error(exc, "connecting") from None


class Deadline:
    """A monotonic deadline for one request: what is left of ``timeout``."""

    def __init__(self, timeout: float) -> None:
        self.at = time.monotonic() + max(0.0, timeout)

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())


def quote_literal_ms(seconds: float) -> str:
    """A GUC duration in whole milliseconds, at least 1 (0 would mean 'no limit')."""
    return f"{max(1, round(seconds * 1000))}ms"


async def close_quietly(conn: Any, timeout: float = 2.0) -> None:
    """Close gracefully (after asyncpg's cancel of a running statement), else abort."""
    try:
        await conn.close(timeout=timeout)
    except (*DRIVER_ERRORS, TimeoutError):
        conn.terminate()


def notify_channel(table: str) -> str:
    """The NOTIFY channel of a table: ``leaderd_<table>`` (an identifier: <= 63 bytes)."""
    channel = f"leaderd_{table}"
    if len(channel) > 63:
        channel = "leaderd_" + hashlib.sha256(table.encode()).hexdigest()[:32]
    return channel


class Listener:
    """A dedicated connection that LISTENs on a channel and wakes the elections named in
    the payloads, ``"<term> acquired|released <election>"``.

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
        self._acquired: dict[str, asyncio.Event] = {}  # set on "<term> acquired" news
        self._task: asyncio.Task[None] | None = None
        self._up = asyncio.Event()

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

    async def wait(self, election: str, timeout: float) -> None:
        event = self._event(election)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(0.0, timeout))
            # Told once: a wake-up that no request follows up (backend down) must not
            # turn every later wait into a spin.
            event.clear()

    async def acquired(self, election: str, timeout: float) -> bool:
        """True when another node announces it acquired ``election`` within ``timeout``."""
        event = self._acquired[election] = asyncio.Event()
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await event.wait()
        except TimeoutError:
            return False
        finally:
            if self._acquired.get(election) is event:
                del self._acquired[election]
        return True

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        term, kind, election = [*payload.split(" ", 2), "", ""][:3]
        if not term.isdigit() or kind not in ("acquired", "released"):
            return
        if kind == "acquired" and election in self._acquired:
            self._acquired[election].set()
        state = _state(int(term), kind == "acquired")
        if state > self._notified.get(election, -1):
            self._notified[election] = state
        if state > self._seen.get(election, -1) and election in self._events:
            self._events[election].set()

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                await self._listen()
                backoff = 0.1
            except (*DRIVER_ERRORS, TimeoutError) as exc:
                log.warning(
                    "LISTEN %s: %s; polling until it is back",
                    self.channel,
                    self._pg.error(exc, "listening"),
                )
            except BackendError as exc:
                log.warning("LISTEN %s: %s; polling until it is back", self.channel, exc)
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, 5.0)

    async def _listen(self) -> None:
        conn = await self._pg.connect(self._pg.connect_timeout, {})
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())
        try:
            await conn.add_listener(self.channel, self._on_notify)
            self.listening = True
            self.wake_all()  # changes made while nobody listened were not heard
            self._up.set()
            while not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lost.wait(), self.PING)
                    break
                await conn.execute("SELECT 1", timeout=5.0)
        finally:
            conn.terminate()
            if self.listening:
                self.listening = False
                self.wake_all()  # from now on waiters poll: let them re-read at once


def _state(term: int, held: bool) -> int:
    """Orders what a lease can show: held with T < free after T < held with T + 1."""
    return 2 * term + (0 if held else 1)
