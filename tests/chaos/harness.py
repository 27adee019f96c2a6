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
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import asyncpg

from tests.daemons import Daemon, short_tempdir
from tests.pgserver import PgServer

from .check import Fault, Violations, check_liveness, check_safety, failover_stats
from .observe import Answer, Observations, Poller, Watcher
from .proxy import FaultProxy

BACKENDS = ("sqlite", "postgresql", "advisory", "etcd")
PROCESS_FAULTS = ("sigkill", "sigstop", "sigterm")
# Faults of the members of a 3-member etcd cluster (tests/etcd/chaos.py injects them).
ETCD_FAULTS = ("etcd_kill", "etcd_leader_kill", "etcd_stop", "etcd_quorum_loss")
FAULTS = {
    "sqlite": (*PROCESS_FAULTS, "db_lock"),
    "postgresql": (*PROCESS_FAULTS, "pg_restart", "pg_terminate", "latency", "blackhole", "reset"),
    "etcd": (*PROCESS_FAULTS, *ETCD_FAULTS),
}
FAULTS["advisory"] = FAULTS["postgresql"]
ALL_FAULTS = tuple(dict.fromkeys(FAULTS["sqlite"] + FAULTS["postgresql"] + ETCD_FAULTS))
# Faults that take the leader away the moment they hit it: a leader is owed from the
# injection (DESIGN §1.6; for SIGSTOP counted from the stop). The others hold the cluster
# back while they last: a leader is owed from the heal.
_AT_ONCE = ("sigkill", "sigterm", "sigstop", "pg_terminate", "reset")
_SCHEME = {"postgresql": "postgresql", "advisory": "postgresql+advisory"}


@dataclass
class Settings:
    backend: str = "sqlite"
    nodes: int = 5
    duration: float = 60.0
    seed: int = 1
    ttl: float = 1.5
    renew_interval: float = 0.4
    retry_interval: float = 0.2
    poll_interval: float = 0.01
    # Scheduling slack on top of DESIGN §1.6's ttl + retry_interval (a busy 2-core machine).
    slack: float = 1.5
    faults: tuple[str, ...] = ()  # empty: every fault the backend supports
    leader_bias: float = 0.7  # how often a process or network fault aims at the leader
    unsafe: bool = False  # run tests/chaos/unsafe_daemon.py: self-fencing disabled
    keep: bool = False  # keep the work directory (daemon logs) even without violations

    @property
    def bound(self) -> float:
        return self.ttl + self.retry_interval + self.slack

    def kinds(self) -> tuple[str, ...]:
        allowed = FAULTS[self.backend]
        chosen = tuple(k for k in self.faults if k in allowed) if self.faults else allowed
        if not chosen:
            raise ValueError(f"none of the faults {self.faults} applies to {self.backend}")
        return chosen


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
            },
            "workdir": self.workdir,
            "faults": [f.as_dict(self.t0) for f in self.faults],
        }


class Node:
    """A daemon with its observers, its proxy (PostgreSQL) and what the harness did to it."""

    def __init__(self, daemon: Daemon, proxy: FaultProxy | None, obs: Observations, s: Settings):
        self.id = daemon.node_id
        self.daemon = daemon
        self.proxy = proxy
        self.poller = Poller(self.id, daemon.socket, obs, s.poll_interval)
        self.watcher = Watcher(self.id, daemon.socket, obs)
        self.down = False  # killed or terminated by the harness, restart pending
        self.stopped = False  # SIGSTOPped
        self.busy = False  # a network fault is on its link

    @property
    def available(self) -> bool:
        return not (self.down or self.stopped or self.busy) and self.daemon.alive()

    async def exited(self, timeout: float) -> int | None:
        """The exit code once the process is gone; None if it still runs after ``timeout``."""
        proc = self.daemon.proc
        assert proc is not None
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.005)
        return proc.returncode


class Chaos:
    def __init__(self, settings: Settings, pg: PgServer | None = None) -> None:
        self.s = settings
        self.rng = random.Random(settings.seed)
        self.kinds = settings.kinds()
        self.deck: list[str] = []
        self.pg = pg
        self.own_pg = False
        self.obs = Observations()
        self.violations = Violations()
        self.nodes: list[Node] = []
        self.faults: list[Fault] = []
        self.background: set[asyncio.Task[None]] = set()
        self.workdir = ""
        self.t0 = 0.0
        self.restarts = 0

    # ---- the run ----

    async def run(self) -> Result:
        await self._start()
        try:
            until = time.monotonic() + self.s.duration
            while time.monotonic() < until:
                await self._one_fault()
            await self._heal_all()
            await self._check_watchers()
        finally:
            end = time.monotonic()
            await self._stop()
        found = Violations()
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
            {"polls_by_node": {n.id: n.poller.polls for n in self.nodes}},
        )

    async def _start(self) -> None:
        s = self.s
        self.workdir = short_tempdir("chaos-")
        if s.backend == "sqlite":
            url = f"sqlite://{self.workdir}/lease.db"
        elif self.pg is None:
            self.pg, self.own_pg = await asyncio.to_thread(PgServer), True
        table = f"chaos_{s.backend}_{os.getpid()}_{int(time.time())}"
        for i in range(s.nodes):
            node_id, proxy = f"node-{i}", None
            if self.pg is not None:
                proxy = await FaultProxy(node_id, self.pg.host, self.pg.port).start()
                url = (
                    f"{_SCHEME[s.backend]}://postgres@127.0.0.1:{proxy.port}/postgres"
                    f"?application_name=leaderd-{node_id}&table={table}&connect_timeout=2"
                )
            self.nodes.append(Node(self._daemon(node_id, url), proxy, self.obs, s))
        await self._launch()

    def _daemon(self, node_id: str, url: str) -> Daemon:
        """One daemon of the run: its timing, and self-fencing off in an unsafe run."""
        s = self.s
        daemon = Daemon(
            node_id,
            url,
            workdir=self.workdir,
            ttl=s.ttl,
            renew_interval=s.renew_interval,
            retry_interval=s.retry_interval,
            env={"LEADERD_UNSAFE_NO_FENCE": "1"} if s.unsafe else None,
            extra_args=("--log-level", "info"),  # debug logs every SQL statement
        )
        if s.unsafe:
            daemon.args[daemon.args.index("leaderd")] = "tests.chaos.unsafe_daemon"
        return daemon

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
            if node.proxy is not None:
                await node.proxy.close()
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
        node.daemon.start()
        node.down = node.stopped = False
        self.restarts += 1

    # ---- faults ----

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

    def _target(self) -> tuple[Node, str] | None:
        ready = [n for n in self.nodes if n.available]
        leader = self._leader()
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
        if kind in ("pg_restart", "db_lock"):
            fault.target = "postgres" if kind == "pg_restart" else "sqlite"
        else:
            picked = self._target()
            if picked is None:
                await asyncio.sleep(0.05)
                return
            node, fault.target_role = picked
            fault.target = node.id
        fault.injected = time.monotonic()
        await inject(fault)
        fault.healed = max(fault.healed, fault.injected)
        at_once = kind in _AT_ONCE and fault.target_role == "leader"
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

    async def _fault_sigkill(self, fault: Fault) -> None:
        node = self._node(fault)
        node.down = True
        os.killpg(node.daemon.pid, signal.SIGKILL)
        await node.exited(10)
        fault.params["restart_after_s"] = delay = round(self.rng.uniform(0.2, 2.0), 3)
        self._spawn(self._restart_later(node, delay))

    async def _fault_sigterm(self, fault: Fault) -> None:
        node = self._node(fault)
        node.down = True
        node.daemon.signal(signal.SIGTERM)
        fault.params["restart_after_s"] = delay = round(self.rng.uniform(0.2, 1.5), 3)
        self._spawn(self._after_sigterm(node, fault, delay))

    async def _after_sigterm(self, node: Node, fault: Fault, delay: float) -> None:
        code = await node.exited(15)
        took = time.monotonic() - fault.injected
        fault.params["exit_code"], fault.params["exit_s"] = code, round(took, 3)
        if code != 0:
            what = "still running after 15s" if code is None else f"exited with code {code}"
            self.violations.add(
                "sigterm_exit",
                node=node.id,
                fault=fault.index,
                explanation=f"{node.id} {what} after SIGTERM (DESIGN §1.7: exit 0)",
                log_tail=node.daemon.log()[-3000:],
            )
            node.daemon.kill()
        await self._restart_later(node, delay)

    async def _restart_later(self, node: Node, delay: float) -> None:
        await asyncio.sleep(delay)
        self._restart(node)

    async def _fault_sigstop(self, fault: Fault) -> None:
        node = self._node(fault)
        fault.params["stopped_s"] = pause = round(self._pause(), 3)
        node.stopped = True
        os.kill(node.daemon.pid, signal.SIGSTOP)
        await asyncio.sleep(pause)
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.daemon.pid, signal.SIGCONT)
        node.stopped = False
        fault.healed = time.monotonic()

    async def _fault_db_lock(self, fault: Fault) -> None:
        """Another process holds the SQLite write lock (a backup, a careless sqlite3 shell)."""
        fault.params["locked_s"] = hold = round(self.rng.uniform(0.2, 2 * self.s.ttl), 3)
        path = os.path.join(self.workdir, "lease.db")
        locked, fault.healed = await asyncio.to_thread(_hold_write_lock, path, hold)
        fault.injected = locked

    async def _fault_pg_restart(self, fault: Fault) -> None:
        assert self.pg is not None
        await asyncio.to_thread(self.pg.restart)
        fault.healed = time.monotonic()

    async def _fault_pg_terminate(self, fault: Fault) -> None:
        assert self.pg is not None
        conn = await asyncpg.connect(self.pg.dsn(), timeout=5)
        try:
            killed = await conn.fetchval(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                " FROM pg_stat_activity WHERE application_name = $1",
                f"leaderd-{fault.target}",
            )
        finally:
            await conn.close()
        fault.params["backends_terminated"] = killed

    async def _fault_latency(self, fault: Fault) -> None:
        delay, hold = round(self.rng.uniform(0.05, 0.8), 3), round(self.rng.uniform(0.5, 3), 3)
        fault.params.update(delay_s=delay, held_s=hold)
        await self._on_link(fault, lambda proxy: setattr(proxy, "delay", delay), hold)

    async def _fault_blackhole(self, fault: Fault) -> None:
        fault.params["held_s"] = hold = round(self._pause(), 3)
        await self._on_link(fault, FaultProxy.blackhole, hold)

    async def _on_link(
        self, fault: Fault, break_: Callable[[FaultProxy], None], hold: float
    ) -> None:
        """Break the link between the target and PostgreSQL for ``hold`` seconds."""
        node = self._node(fault)
        assert node.proxy is not None
        node.busy = True
        break_(node.proxy)
        await asyncio.sleep(hold)
        node.proxy.heal()
        node.busy, fault.healed = False, time.monotonic()

    async def _fault_reset(self, fault: Fault) -> None:
        node = self._node(fault)
        assert node.proxy is not None
        fault.params["connections_reset"] = node.proxy.reset()

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


def _hold_write_lock(path: str, hold: float) -> tuple[float, float]:
    conn = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        locked = time.monotonic()
        time.sleep(hold)
        conn.execute("ROLLBACK")
        return locked, time.monotonic()
    finally:
        conn.close()
