"""Observing daemons from outside, over their Unix sockets, as applications do.

``Poller``: an open-loop ``GET /leader`` every ``interval`` seconds (a new request does not wait
for the previous answer, up to ``MAX_IN_FLIGHT``), each recorded with the monotonic times it
was sent and answered. Open loop matters: requests sent while a daemon is SIGSTOPped are all
answered after SIGCONT, which is exactly when a daemon that does not self-fence lies.

``Watcher``: one long-lived ``GET /watch?stream=1`` per daemon, reconnecting after restarts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from .check import Claim, Violations

MAX_IN_FLIGHT = 100  # below aiohttp's listen backlog (128): connects never block
REQUEST_TIMEOUT = 10.0  # longer than any SIGSTOP the schedule makes


@dataclass(slots=True)
class Answer:
    """A daemon's answer: (sent, received, HTTP status, role, term, leader node, revision)."""

    sent: float
    received: float
    status: int
    role: str
    term: int
    leader: str | None
    revision: int

    @classmethod
    def parse(cls, sent: float, received: float, status: int, body: dict[str, Any]) -> Answer:
        leader = body.get("leader")
        return cls(
            sent,
            received,
            status,
            body["role"],
            body["term"],
            leader["node_id"] if leader else None,
            body["revision"],
        )

    def key(self) -> tuple[Any, ...]:
        return (self.revision, self.role, self.term, self.leader)


@dataclass
class Observations:
    """Everything the observers saw, shared by all of them."""

    claims: list[Claim] = field(default_factory=list)
    violations: Violations = field(default_factory=Violations)
    answers_by_role: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    watch_events: int = 0
    last_leader_sent: float = -1.0  # the latest send time of a poll answered "leader"
    last_leader: str | None = None

    def answered(self, node: str, answer: Answer, source: str) -> None:
        if answer.role == "leader":
            self.claims.append(Claim(node, answer.term, answer.sent, answer.received, source))
            if source == "poll" and answer.sent > self.last_leader_sent:
                self.last_leader_sent, self.last_leader = answer.sent, node


class _Observer:
    """One background task and one HTTP session on a daemon's Unix socket."""

    def __init__(self, node: str, socket_path: str, obs: Observations) -> None:
        self.node = node
        self.obs = obs
        self.last: Answer | None = None
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=socket_path, limit=0)
        )
        self._task: asyncio.Task[None] | None = None
        self._requests: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def post(self, path: str) -> int | None:
        """A POST (e.g. /resign): its status, None when the daemon does not answer."""
        try:
            async with self._session.post(f"http://leaderd{path}") as resp:
                return resp.status
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None

    async def _run(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        tasks = [t for t in [self._task, *self._requests] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._session.close()


class Poller(_Observer):
    def __init__(self, node: str, socket_path: str, obs: Observations, interval: float) -> None:
        super().__init__(node, socket_path, obs)
        self.interval = interval
        self.polls = 0
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)

    async def get(self, path: str = "/leader") -> Answer | None:
        """One request, recorded like every poll; None when the daemon does not answer."""
        sent = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
        try:
            async with self._session.get(f"http://leaderd{path}", timeout=timeout) as resp:
                raw = await resp.read()
                received = time.monotonic()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError):
            self.obs.errors += 1
            return None
        answer = Answer.parse(sent, received, status, orjson.loads(raw))
        self._record(answer)
        return answer

    def _record(self, answer: Answer) -> None:
        self.polls += 1
        obs = self.obs
        obs.answers_by_role[answer.role] = obs.answers_by_role.get(answer.role, 0) + 1
        if (answer.status == 200) != (answer.role == "leader"):
            obs.violations.add(
                "api_inconsistent",
                node=self.node,
                explanation=f"/leader answered {answer.status} with role {answer.role}",
            )
        obs.answered(self.node, answer, "poll")
        if self.last is None or answer.sent >= self.last.sent:
            self.last = answer

    async def _run(self) -> None:
        while True:
            await self._slots.acquire()
            task = asyncio.create_task(self._one())
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)
            await asyncio.sleep(self.interval)

    async def _one(self) -> None:
        try:
            if await self.get() is None:
                await asyncio.sleep(0.02)  # down or restarting: do not spin on refusals
        finally:
            self._slots.release()


class Watcher(_Observer):
    """Keeps a /watch stream open; ``last`` is the latest event it received."""

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=2)
        while True:
            opened = time.monotonic()
            try:
                async with self._session.get(
                    "http://leaderd/watch?stream=1", timeout=timeout
                ) as resp:
                    if resp.status != 200:
                        raise aiohttp.ClientError(f"status {resp.status}")
                    previous: Answer | None = None
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        event = Answer.parse(opened, time.monotonic(), 0, orjson.loads(line))
                        self._event(previous, event)
                        previous = self.last = event
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
                pass
            await asyncio.sleep(0.05)

    def _event(self, previous: Answer | None, event: Answer) -> None:
        self.obs.watch_events += 1
        # Each event was produced after the stream was asked for and before it arrived.
        self.obs.answered(self.node, event, "watch")
        if previous is not None and event.revision <= previous.revision:
            self.obs.violations.add(
                "watch_order",
                node=self.node,
                explanation=f"stream revision {event.revision} after {previous.revision}",
            )
