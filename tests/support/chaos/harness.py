"""One chaos run: N real daemons on one backend, a seeded fault schedule, outside observers.

Faults come one at a time: inject, wait for the heal (a SIGSTOP, blackhole, latency or
database lock lasts a drawn time), wait until some daemon is seen leading again (at most
the liveness bound), pause briefly, next. Killed and terminated daemons are restarted in
the background after a drawn delay, so further faults do not wait for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.support.daemons import Daemon, short_tempdir
from tests.support.pgserver import FakeTimeServer, PgServer

from .check import (
    Fault,
    Violations,
    check_commands,
    check_liveness,
    check_safety,
    failover_stats,
    spans,
)
from .node import Node
from .observe import Answer, Observations
from .process_faults import ProcessFaults, processes_naming
from .proxy import FaultProxy
from .request_faults import RequestFaults
from .server_faults import PostgresFaults
from .settings import AT_ONCE, KEEPER_FAULTS, NO_TARGET, Settings
from .sqlite_faults import STALL_FLAG, SqliteFaults, build_fsync_shim, stall_flag

_SCHEME = {"postgresql": "postgresql", "advisory": "postgresql+advisory"}


@dataclass
class Result:
    settings: Settings
    faults: list[Fault]
    violations: Violations
    seconds: float
    t0: float
    obs: Observations
    workdir: str | None
    restarts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def injected(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for f in self.faults:
            counts[f.kind] = counts.get(f.kind, 0) + 1
        return dict(sorted(counts.items()))

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.settings.backend,
            "settings": {**asdict(self.settings), "liveness_bound_s": self.settings.bound},
            "seconds": round(self.seconds, 1),
            "faults_injected": len(self.faults),
            "faults_by_kind": self.injected(),
            "violations": self.violations.total,
            "violations_by_kind": dict(sorted(self.violations.counts.items())),
            "violation_details": self.violations.listed,
            "failover": failover_stats(self.faults),
            "observations": {
                "leader_answers": sum(1 for c in self.obs.claims if c.source == "poll"),
                "answers_by_role": dict(sorted(self.obs.answers_by_role.items())),
                "failed_requests": self.obs.errors,
                "watch_events": self.obs.watch_events,
                "daemon_restarts": self.restarts,
                "polls_by_node": self.extra.get("polls_by_node", {}),
                "requests_by_kind": self.extra.get("requests_by_kind", {}),
                "commands_started": self.extra.get("commands_started"),
            },
            "workdir": self.workdir,
            "faults": [f.as_dict(self.t0) for f in self.faults],
        }


class Chaos(ProcessFaults, PostgresFaults, RequestFaults, SqliteFaults):
    def __init__(self, settings: Settings, pg: PgServer | None = None) -> None:
        self.s = settings
        self.rng = random.Random(settings.seed)
        self.kinds = settings.kinds()
        self.deck: list[str] = []
        self.pg = pg
        self.own_pg = False
        self.clock_offset = 0  # seconds the clock_step faults moved the server forward
        self.obs = Observations()
        self.violations = Violations()
        self.nodes: list[Node] = []
        self.faults: list[Fault] = []
        self.background: set[asyncio.Task[None]] = set()
        self.workdir = ""
        self.t0 = 0.0
        self.restarts = 0
        self.extra: dict[str, Any] = {}
        self.fsync_shim: str | None = None

    # ---- the run ----

    async def run(self) -> Result:
        await self._start()
        try:
            until = time.monotonic() + self.s.duration
            while time.monotonic() < until and not self._dealt() and not self._caught():
                await self._one_fault()
            await self._heal_all()
            await self._check_watchers()
        finally:
            end = time.monotonic()
            await self._stop()
        found = Violations()
        if self.s.supervise:
            found.merge(self._check_commands())
        found.merge(check_safety(self.obs.claims, self.t0))
        found.merge(check_liveness(self.faults, self.obs.claims, self.s.bound, end, self.t0))
        found.merge(self.obs.violations)
        found.merge(self.violations)
        keep = self.s.keep or found.total > 0
        if not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return Result(
            self.s,
            self.faults,
            found,
            end - self.t0,
            self.t0,
            self.obs,
            self.workdir if keep else None,
            self.restarts,
            {
                "polls_by_node": {n.id: n.poller.polls for n in self.nodes},
                "requests_by_kind": {n.id: dict(n.rules.seen) for n in self.nodes},
                **self.extra,
            },
        )

    @property
    def beats(self) -> str:
        return os.path.join(self.workdir, "beats")

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "tests.chaos.command", self.beats]

    def _check_commands(self) -> Violations:
        """No two supervised commands alive at once; none alive after every daemon stopped."""
        try:
            text = Path(self.beats).read_text()
        except FileNotFoundError:
            text = ""
        found = spans(text)
        self.extra["commands_started"] = len(found)
        violations = check_commands(found, self.t0)
        for pid in processes_naming(self.beats):
            violations.add(
                "command_survived",
                pid=pid,
                explanation=f"pid {pid} of a supervised command outlived every daemon",
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return violations

    async def _start(self) -> None:
        s = self.s
        self.workdir = short_tempdir("chaos-")
        if s.backend == "sqlite":
            url = f"sqlite://{self.workdir}/lease.db"
            self.fsync_shim = await asyncio.to_thread(build_fsync_shim, self.workdir)
            if self.fsync_shim is None:  # no C compiler: no shim to stall fsync with
                self.kinds = tuple(k for k in self.kinds if k != "fsync_stall")
        elif self.pg is None:
            # Its own server, whose clock the clock_step fault can move (libfaketime).
            self.pg, self.own_pg = await asyncio.to_thread(FakeTimeServer), True
        table = f"chaos_{s.backend}_{os.getpid()}_{int(time.time())}"
        for i in range(s.nodes):
            node_id, proxy = f"node-{i}", None
            if self.pg is not None:
                proxy = await FaultProxy(node_id, self.pg.host, self.pg.port, "pg").start()
                url = (
                    f"{_SCHEME[s.backend]}://postgres@127.0.0.1:{proxy.port}/postgres"
                    f"?application_name=leaderd-{node_id}&table={table}&connect_timeout=2"
                )
            self.nodes.append(Node(self._daemon(node_id, url), proxy, self.obs, s))
        await self._launch()

    async def _launch(self) -> None:
        """Start every node's daemon and observers; wait for a first leader; t0 is then."""
        for node in self.nodes:
            node.daemon.start()
            node.poller.start()
            node.watcher.start()
        self._spawn(self._monitor())
        if not await until(lambda: self.obs.last_leader is not None, time.monotonic() + 30):
            raise RuntimeError(f"no leader within 30s; daemon logs in {self.workdir}")
        self.t0 = time.monotonic()

    def _daemon(self, node_id: str, url: str) -> Daemon:
        s = self.s
        daemon = Daemon(
            node_id,
            url,
            workdir=self.workdir,
            ttl=s.ttl,
            renew_interval=s.renew_interval,
            retry_interval=s.retry_interval,
            env=self._env(node_id),
            extra_args=("--log-level", "info"),  # debug logs every SQL statement
            command=[sys.executable, "-m", "tests.chaos.command", self.beats]
            if s.supervise
            else (),
        )
        if s.unsafe:
            daemon.args[daemon.args.index("leaderd")] = "tests.chaos.unsafe_daemon"
        return daemon

    def _env(self, node_id: str) -> dict[str, str]:
        env = {"LEADERD_UNSAFE_NO_FENCE": "1"} if self.s.unsafe else {}
        if self.fsync_shim is not None:
            env |= {"LD_PRELOAD": self.fsync_shim, STALL_FLAG: stall_flag(self.workdir, node_id)}
        return env

    async def _stop(self) -> None:
        for task in list(self.background):
            task.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)
        for node in self.nodes:
            await node.poller.close()
            await node.watcher.close()
        for node in self.nodes:
            with contextlib.suppress(ProcessLookupError):
                if node.stopped:
                    os.kill(node.daemon.pid, signal.SIGCONT)
            if node.daemon.alive():
                node.daemon.signal(signal.SIGTERM)
        for node in self.nodes:
            if node.daemon.proc is not None and await node.exited(15) is None:
                node.daemon.kill()
            for proxy in node.proxies:
                await proxy.close()
        if self.own_pg and self.pg is not None:
            await asyncio.to_thread(self.pg.cleanup)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _monitor(self) -> None:
        """A daemon that exits without being told to is a finding; it is restarted."""
        while True:
            await asyncio.sleep(0.1)
            for node in self.nodes:
                proc = node.daemon.proc
                if node.down or proc is None or proc.poll() is None:
                    continue
                self.violations.add(
                    "daemon_exit",
                    node=node.id,
                    at_s=round(time.monotonic() - self.t0, 3),
                    explanation=f"{node.id} exited with code {proc.returncode} on its own",
                    log_tail=node.daemon.log()[-3000:],
                )
                self._restart(node)

    def _restart(self, node: Node) -> None:
        node.started = time.monotonic()
        node.daemon.start()
        node.down = node.stopped = False
        self.restarts += 1

    # ---- faults ----

    def _dealt(self) -> bool:
        """Every kind injected ``decks`` times (never, with decks=0)."""
        if not self.s.decks:
            return False
        injected = Counter(fault.kind for fault in self.faults)
        return all(injected[kind] >= self.s.decks for kind in self.kinds)

    def _caught(self) -> bool:
        """A safety rule already broken, when the run stops at the first one."""
        return self.s.until_violation and check_safety(self.obs.claims).total > 0

    def _next_kind(self) -> str:
        """Every kind once per shuffled deck: a short run still sees each kind."""
        if not self.deck:
            self.deck = list(self.kinds)
            self.rng.shuffle(self.deck)
        return self.deck.pop()

    def _leader(self) -> Node | None:
        now = time.monotonic()
        for node in self.nodes:
            last = node.poller.last
            if last is not None and last.role == "leader" and now - last.received < 0.3:
                return node
        return None

    def _target(self, leader_only: bool = False) -> tuple[Node, str] | None:
        ready = [n for n in self.nodes if n.available]
        leader = self._leader()
        if leader_only:  # only a leader has a keeper
            return (leader, "leader") if leader in ready else None
        if leader is not None and leader in ready and self.rng.random() < self.s.leader_bias:
            return leader, "leader"
        others = [n for n in ready if n is not leader]
        if others:
            return self.rng.choice(others), "follower"
        return (leader, "leader") if leader in ready else None

    async def _one_fault(self) -> None:
        kind = self._next_kind()
        inject: Callable[[Fault], Awaitable[None]] = getattr(self, f"_fault_{kind}")
        fault = Fault(len(self.faults), kind, "-", "-", 0.0, 0.0, 0.0)
        if kind in NO_TARGET:
            fault.target = NO_TARGET[kind]
        else:
            picked = self._target(leader_only=kind in KEEPER_FAULTS)
            if picked is None:
                await asyncio.sleep(0.05)
                return
            node, fault.target_role = picked
            fault.target = node.id
        fault.injected = time.monotonic()
        await inject(fault)
        fault.healed = max(fault.healed, fault.injected)
        at_once = kind in AT_ONCE and fault.target_role == "leader"
        fault.ref = fault.injected if at_once else fault.healed
        self.faults.append(fault)
        await until(lambda: self.obs.last_leader_sent >= fault.ref, fault.ref + self.s.bound)
        await asyncio.sleep(self.rng.uniform(0.1, 0.6))

    def _node(self, fault: Fault) -> Node:
        return next(n for n in self.nodes if n.id == fault.target)

    def _pause(self) -> float:
        """A SIGSTOP or blackhole length: half shorter than the ttl, half up to 2.5 ttl."""
        ttl = self.s.ttl
        if self.rng.random() < 0.5:
            return self.rng.uniform(0.05, ttl)
        return self.rng.uniform(ttl, 2.5 * ttl)

    # ---- the end ----

    async def _heal_all(self) -> None:
        """Let every pending restart happen and every fault end; then wait for a leader."""
        await until(lambda: not any(n.down for n in self.nodes), math.inf)
        if self.pg is not None and not self.pg.is_running():
            await asyncio.to_thread(self.pg.start)
        settled = time.monotonic()
        await until(lambda: self.obs.last_leader_sent >= settled, settled + 30)

    async def _check_watchers(self, attempts: int = 8) -> None:
        """Rule 4: each watcher's last event is the daemon's final /leader answer."""
        mismatched: list[tuple[Node, Answer | None, Answer | None]] = []
        for _ in range(attempts):
            await asyncio.sleep(1.0)
            finals = [await n.poller.get() for n in self.nodes]
            await asyncio.sleep(0.5)  # a stream may trail an answer by a moment
            mismatched = [
                (n, final, n.watcher.last)
                for n, final in zip(self.nodes, finals, strict=True)
                if final is None or n.watcher.last is None or n.watcher.last.key() != final.key()
            ]
            if not mismatched:
                return
        for node, final, last in mismatched:
            self.violations.add(
                "watch_final",
                node=node.id,
                final=None if final is None else final.key(),
                watcher_last=None if last is None else last.key(),
                explanation=f"{node.id}: the watcher did not end on the final /leader answer",
            )


async def until(predicate: Callable[[], bool], deadline: float, interval: float = 0.01) -> bool:
    """Poll ``predicate`` (state many observers update) until true or the monotonic deadline."""
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)
    return True
