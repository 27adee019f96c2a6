"""A fault-injecting TCP proxy: one per daemon and backend endpoint, on 127.0.0.1.

Faults are real network behaviour on real sockets:

* latency: every chunk waits ``delay`` seconds before it is passed on (both directions,
  order kept), so a round trip takes ``2 * delay`` more;
* blackhole: nothing passes either way and new connections get no upstream, as when
  packets are dropped; bytes already sent wait, as TCP retransmissions would, and flow
  again when the blackhole ends (or find the other side gone by then);
* reset: every open connection is aborted with a TCP RST on both sides;
* hold: the next client-to-server unit that contains a given byte string (a statement's
  text, or a parameter of its Bind) waits ``seconds`` on its connection, the bytes behind it
  too, then reaches the server although the client gave up on it long ago; optionally the
  proxy then blackholes, so the client hears of nothing that followed.

Per-request faults: with a protocol (``"http"`` for etcd's JSON gateway,
``tests/support/chaos/http_requests.py``; ``"pg"`` for PostgreSQL's wire protocol,
``tests/support/chaos/pg_messages.py``) each direction is cut into whole requests and answers named
by kind (``"txn"``, ``"keepalive"``, ``"acquire"``, ``"notify"`` ...), and the rules of a
``RuleBook`` act on one kind: delay or stall it, drop a request before the server sees it,
lose the answer of one the server applied, or deliver one late. One book may serve all the
proxies of a daemon (etcd: one proxy per member), so a one-shot rule fires once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .http_requests import HttpAnswers, HttpRequests
from .pg_messages import PgAnswers, PgRequests
from .wire import Link, Raw, Units, abort

DELAY, DROP, LOSE_ANSWER, LATE = "delay", "drop", "lose_answer", "late"


@dataclass
class Rule:
    """What happens to units of one kind: ``delay`` (each waits ``seconds``, or until the
    rule ends; ``math.inf``: a stall), or once: ``drop`` (the request never reaches the
    server; its connection goes silent and is cut after ``seconds``), ``lose_answer`` (the
    server applies it; its answer never comes back, and the connection is cut) or ``late``
    (it reaches the server ``seconds`` later, after the client gave up)."""

    action: str
    seconds: float = 0.0
    fired: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    fired_at: float = 0.0


class RuleBook:
    """The rules of one daemon's proxies, by request kind."""

    def __init__(self) -> None:
        self.rules: dict[str, Rule] = {}
        self.seen: dict[str, int] = {}  # units by kind, for the report and the tests

    def arm(self, kind: str, rule: Rule) -> Rule:
        self.end(kind)
        self.rules[kind] = rule
        return rule

    def end(self, kind: str) -> None:
        rule = self.rules.pop(kind, None)
        if rule is not None:
            rule.ended.set()

    def end_all(self) -> None:
        for kind in list(self.rules):
            self.end(kind)

    def take(self, kind: str | None) -> Rule | None:
        """The rule for ``kind``; a one-shot rule fires here and leaves the book."""
        if kind is None:
            return None
        self.seen[kind] = self.seen.get(kind, 0) + 1
        rule = self.rules.get(kind)
        if rule is not None and rule.action != DELAY:
            del self.rules[kind]
            rule.fired_at = time.monotonic()
            rule.fired.set()
        return rule


Framer = Callable[[Link], Units]
_FRAMERS: dict[str, tuple[Framer, Framer]] = {
    "raw": (Raw, Raw),
    "http": (HttpRequests, HttpAnswers),
    "pg": (PgRequests, PgAnswers),
}


class FaultProxy:
    def __init__(
        self,
        name: str,
        upstream_host: str,
        upstream_port: int,
        protocol: str = "raw",
        rules: RuleBook | None = None,
    ) -> None:
        self.name = name
        self.upstream = (upstream_host, upstream_port)
        self.protocol = protocol
        self.rules = rules if rules is not None else RuleBook()
        self.delay = 0.0
        self.port = 0
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._links: set[Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0
        self._hold: tuple[bytes, float, bool] | None = None
        self.held = asyncio.Event()  # set once a held chunk reached the server

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        self.heal()
        if self._server is not None:
            self._server.close()
        self.reset()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- faults ----

    def blackhole(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self.delay = 0.0
        self._open.set()

    def hold_next(self, pattern: bytes, seconds: float, then_blackhole: bool = False) -> None:
        """Hold the next client-to-server unit containing ``pattern`` for ``seconds``."""
        self._hold, self.held = (pattern, seconds, then_blackhole), asyncio.Event()

    def reset(self) -> int:
        """Abort every open connection with an RST on both sides; how many were open."""
        links = list(self._links)
        for link in links:
            link.abort()
        self._links.clear()
        return len(links)

    # ---- plumbing ----

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._open.wait()  # a blackholed SYN: no upstream until it heals
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                abort(writer)
                return
            self.connections += 1
            requests, answers = _FRAMERS[self.protocol]
            link = Link(writer, up_writer)
            link.framers = (requests(link), answers(link))
            self._links.add(link)
            try:
                await asyncio.gather(
                    self._pump(reader, up_writer, link, upstream=True),
                    self._pump(up_reader, writer, link, upstream=False),
                )
            finally:
                self._links.discard(link)
                link.close()
        except (asyncio.CancelledError, OSError):
            abort(writer)
        finally:
            self._tasks.discard(task)

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, link: Link, upstream: bool
    ) -> None:
        framer: Units = link.framers[0 if upstream else 1]
        try:
            while True:
                data = await src.read(65536)
                if not data:
                    break
                for kind, unit in framer.feed(data):
                    await self._pass(link, kind, unit, dst, upstream)
            await self._open.wait()
            if upstream and link.late:
                # A request delivered late: the server answers it before it sees the EOF
                # (an HTTP server would cancel a request whose client went away).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(link.answered.wait(), 2.0)
            if not dst.is_closing() and dst.can_write_eof():
                dst.write_eof()
        except (OSError, RuntimeError):  # the other side was reset meanwhile
            abort(dst)

    async def _pass(
        self, link: Link, kind: str | None, unit: bytes, dst: asyncio.StreamWriter, upstream: bool
    ) -> None:
        if link.silent:
            return
        if upstream and self._hold is not None and self._hold[0] in unit:
            await self._deliver_late(unit, dst)
            return
        await self._open.wait()
        if self.delay > 0:
            await asyncio.sleep(self.delay)
        if not upstream:
            link.answered.set()
            if link.lose_answer:
                link.silent = True
                link.abort()
                return
        rule = self.rules.take(kind)
        if rule is not None and await self._apply(rule, link, unit, dst):
            return
        dst.write(unit)
        await dst.drain()

    async def _apply(self, rule: Rule, link: Link, unit: bytes, dst: asyncio.StreamWriter) -> bool:
        """Act on one unit under ``rule``; True if it was dealt with (dropped or delivered)."""
        if rule.action == DELAY:
            with contextlib.suppress(TimeoutError):
                seconds = None if math.isinf(rule.seconds) else rule.seconds
                await asyncio.wait_for(rule.ended.wait(), seconds)
            return False
        if rule.action == DROP:
            link.silent = True  # nothing more on this connection: the client waits, then a cut
            asyncio.get_running_loop().call_later(rule.seconds, link.abort)
            return True
        if rule.action == LOSE_ANSWER:
            link.lose_answer = True
            return False
        link.late, link.answered = True, asyncio.Event()
        await asyncio.sleep(rule.seconds)
        dst.write(unit)
        await dst.drain()
        rule.ended.set()
        return True

    async def _deliver_late(self, data: bytes, dst: asyncio.StreamWriter) -> None:
        assert self._hold is not None
        (_, seconds, then_blackhole), self._hold = self._hold, None
        await asyncio.sleep(seconds)
        dst.write(data)
        await dst.drain()
        if then_blackhole:
            self.blackhole()
        self.held.set()
