"""etcd's own election, the reference leaderd's hand-over on etcd is measured against:
``etcdctl elect`` candidates (or bench/etcd_candidate.py's) campaigning in one election,
and a clock of when a plain watcher heard etcd apply each write."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import time
import uuid

import aiohttp

from tests.support.daemons import REPO

CANDIDATES = 3


@dataclasses.dataclass
class Candidate:
    proc: asyncio.subprocess.Process
    proposal: str
    elected: asyncio.Future[float]  # time.monotonic() when it printed its proposal
    reader: asyncio.Task[None]


async def _spawn(args: list[str], proposal: str) -> Candidate:
    proc = await asyncio.create_subprocess_exec(
        *args, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    elected: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def read() -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            if line.strip() == proposal.encode() and not elected.done():
                elected.set_result(time.monotonic())

    return Candidate(proc, proposal, elected, asyncio.create_task(read()))


async def _registered(http: aiohttp.ClientSession, client: str, name: str) -> int:
    """How many candidates wait in the election (keys under NAME/)."""
    prefix = base64.b64encode(f"{name}/".encode()).decode()
    end = base64.b64encode(f"{name}0".encode()).decode()
    body = {"key": prefix, "range_end": end, "count_only": True}
    async with http.post(f"{client}/v3/kv/range", json=body) as response:
        return int((await response.json(content_type=None)).get("count", 0))


class Candidates:
    """``CANDIDATES`` processes campaigning in one etcd election (``command``: etcdctl elect
    or bench/etcd_candidate.py); each one() signals the leader, times the next, and puts a
    fresh candidate in the stopped one's place."""

    def __init__(self, client: str, command: list[str]) -> None:
        self.client, self.command = client, command
        self.name = f"bench-{uuid.uuid4().hex[:8]}"
        self.serial = 0
        self.candidates: list[Candidate] = []
        self.http: aiohttp.ClientSession | None = None
        self.signalled = 0.0  # time.monotonic() of the last signal

    async def __aenter__(self) -> Candidates:
        self.http = aiohttp.ClientSession()
        try:
            for _ in range(CANDIDATES):
                await self._add()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for c in self.candidates:
            if c.proc.returncode is None:
                c.proc.kill()
            await c.proc.wait()
            c.reader.cancel()
        if self.http is not None:
            await self.http.close()

    async def _add(self) -> None:
        assert self.http is not None
        self.serial += 1
        proposal = f"p{self.serial}"
        argv = [a.format(client=self.client, name=self.name, proposal=proposal)
                for a in self.command]  # fmt: skip
        self.candidates.append(await _spawn(argv, proposal))
        while await _registered(self.http, self.client, self.name) < len(self.candidates):  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    async def one(self, signum: int) -> float:
        """Signal the leader; seconds until another candidate prints its proposal."""
        leader = await _first_elected(self.candidates)
        await asyncio.sleep(0.05)  # let the previous leader's key go before signalling
        others = [c.elected for c in self.candidates if c is not leader]
        t0 = self.signalled = time.monotonic()
        leader.proc.send_signal(signum)
        done, _ = await asyncio.wait(others, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            raise RuntimeError("no etcd candidate took over within 120 s")
        sample = done.pop().result() - t0
        await leader.proc.wait()
        leader.reader.cancel()
        self.candidates.remove(leader)
        await self._add()
        return sample


class EventClock:
    """`etcdctl watch` of the keys under ``prefix``: when each event reached a watching
    client, on time.monotonic(). Splits a hand-over in two: until etcd applied the write that
    ends it (a resign's delete, leaderd's grant), and from there to the new leader's answer.
    One election's keys only: an event of the other election (a daemon's heartbeat) is never
    taken for the end of a term, and a grant is one event to print, as a resign is."""

    def __init__(self, client: str, prefix: str) -> None:
        self.client, self.prefix = client, prefix
        self.arrivals: list[float] = []
        self.proc: asyncio.subprocess.Process | None = None
        self.reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> EventClock:
        self.proc = await asyncio.create_subprocess_exec(
            "etcdctl", f"--endpoints={self.client}", "watch", "--prefix", self.prefix,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        self.reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            if line in (b"PUT\n", b"DELETE\n"):  # an event's first line
                self.arrivals.append(time.monotonic())

    async def __aexit__(self, *exc: object) -> None:
        if self.reader is not None:
            self.reader.cancel()
        if self.proc is not None:
            self.proc.kill()
            await self.proc.wait()

    def first_after(self, t0: float) -> float | None:
        """Seconds from ``t0`` to the first event heard after it."""
        return next((t - t0 for t in self.arrivals if t >= t0), None)


async def _first_elected(candidates: list[Candidate]) -> Candidate:
    await asyncio.wait([c.elected for c in candidates], return_when=asyncio.FIRST_COMPLETED)
    return next(c for c in candidates if c.elected.done())
