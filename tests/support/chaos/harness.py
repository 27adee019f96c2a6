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
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from leaderd.supervision.containment import children
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
from .observe import Answer, Observations, Poller, Watcher
from .proxy import FaultProxy, RuleBook
from .request_faults import REQUEST_FAULTS, RequestFaults
from .sqlite_faults import SQLITE_FAULTS, STALL_FLAG, SqliteFaults, build_fsync_shim, stall_flag

BACKENDS = ("sqlite", "postgresql", "advisory", "etcd", "kubernetes")
PROCESS_FAULTS = ("sigkill", "sigstop", "sigterm")
# Faults of the members of a 3-member etcd cluster (tests/support/chaos/etcd.py injects them).
ETCD_FAULTS = ("etcd_kill", "etcd_leader_kill", "etcd_stop", "etcd_quorum_loss")
FAULTS = {
    "sqlite": (*PROCESS_FAULTS, "db_lock", "duplicate_node_id", "file_replaced", *SQLITE_FAULTS),
    "postgresql": (
        *PROCESS_FAULTS,
        *("pg_restart", "pg_crash", "clock_step", "pg_terminate", "latency", "blackhole", "reset"),
        *REQUEST_FAULTS,
    ),
    "etcd": (*PROCESS_FAULTS, *ETCD_FAULTS, *REQUEST_FAULTS, "partition"),
}
FAULTS["advisory"] = FAULTS["postgresql"]
# Faults of the control plane under kubernetes:// (tests/support/chaos/kubernetes.py injects them).
KUBE_FAULTS = ("apiserver_kill", "apiserver_stop", "apiserver_etcd_stop", "rbac_revoke")
FAULTS["kubernetes"] = (*PROCESS_FAULTS, *KUBE_FAULTS)
# Only with Settings.supervise: every daemon runs tests/chaos/command.py under its keeper.
KEEPER_FAULTS = ("keeper_sigkill", "keeper_sigstop", "both_sigstop")
ALL_FAULTS = tuple(
    dict.fromkeys(
        FAULTS["sqlite"] + FAULTS["postgresql"] + FAULTS["etcd"] + KUBE_FAULTS + KEEPER_FAULTS
    )
)
# Faults that take the leader away the moment they hit it: a leader is owed from the
# injection (rule 6; for SIGSTOP counted from the stop). The others hold the cluster
# back while they last: a leader is owed from the heal.
_AT_ONCE = ("sigkill", "sigterm", "sigstop", "pg_terminate", "reset", *KEEPER_FAULTS)
# Faults aimed at no node: the harness picks their target itself.
_NO_TARGET = {"pg_restart": "postgres", "db_lock": "sqlite", "file_replaced": "sqlite"}
_NO_TARGET |= {"pg_crash": "postgres", "clock_step": "postgres"}
CLOCK_STEP = 600  # seconds each clock_step moves the PostgreSQL server's clock forward
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
    # Scheduling slack on top of rule 6's ttl + retry_interval (a busy 2-core machine).
    slack: float = 1.5
    faults: tuple[str, ...] = ()  # empty: every fault the backend supports
    leader_bias: float = 0.7  # how often a process or network fault aims at the leader
    unsafe: bool = False  # run tests/chaos/unsafe_daemon.py: self-fencing disabled
    keep: bool = False  # keep the work directory (daemon logs) even without violations
    supervise: bool = False  # every daemon runs a command (`run -- tests/chaos/command.py`)
    # Stop once every fault kind was injected this many times (duration still caps the run);
    # 0: run the whole duration. The test suite's short runs deal one deck each.
    decks: int = 0
    # Stop after the first fault that broke a safety rule (duration still caps the run): the
    # checker's own test needs one violation, not a whole run of them.
    until_violation: bool = False

    @property
    def bound(self) -> float:
        return self.ttl + self.retry_interval + self.slack

    def kinds(self) -> tuple[str, ...]:
        allowed = FAULTS[self.backend] + (KEEPER_FAULTS if self.supervise else ())
        chosen = tuple(k for k in self.faults if k in allowed) if self.faults else allowed
        if not chosen:
            need = (
                " (keeper faults need --supervise)" if set(self.faults) & set(KEEPER_FAULTS) else ""
            )
            raise ValueError(f"none of the faults {self.faults} applies to {self.backend}{need}")
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
                "requests_by_kind": self.extra.get("requests_by_kind", {}),
                "commands_started": self.extra.get("commands_started"),
            },
            "workdir": self.workdir,
            "faults": [f.as_dict(self.t0) for f in self.faults],
        }


class Node:
    """A daemon with its observers, its proxies (PostgreSQL: one; etcd: one per member), the
    rules they share, and what the harness did to it."""

    def __init__(
        self,
        daemon: Daemon,
        proxy: FaultProxy | None,
        obs: Observations,
        s: Settings,
        proxies: list[FaultProxy] | None = None,
    ):
        self.id = daemon.node_id
        self.daemon = daemon
        self.proxy = proxy
        self.proxies = proxies if proxies is not None else [proxy] if proxy else []
        self.rules = self.proxies[0].rules if self.proxies else RuleBook()
        self.poller = Poller(self.id, daemon.socket, obs, s.poll_interval)
        self.watcher = Watcher(self.id, daemon.socket, obs)
        self.down = False  # killed or terminated by the harness, restart pending
        self.stopped = False  # SIGSTOPped
        self.busy = False  # a network fault is on its link
        self.started = 0.0  # harness monotonic time of the last (re)start

    @property
    def available(self) -> bool:
        # Answered since its last start: a signal never lands before its handlers are in.
        last = self.poller.last
        answered = last is not None and last.received >= self.started
        return answered and not (self.down or self.stopped or self.busy) and self.daemon.alive()

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


class Chaos(RequestFaults, SqliteFaults):
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
        if kind in _NO_TARGET:
            fault.target = _NO_TARGET[kind]
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
        self._check_exit(node, fault, code, 0, "sigterm_exit", "SIGTERM (rule 7: exit 0)")
        await self._restart_later(node, delay)

    def _check_exit(
        self, node: Node, fault: Fault, code: int | None, expected: int, kind: str, after: str
    ) -> None:
        """A daemon's exit after a fault: any other code, or none, is a ``kind`` violation."""
        if code == expected:
            return
        what = "still running after 15s" if code is None else f"exited with code {code}"
        self.violations.add(
            kind,
            node=node.id,
            fault=fault.index,
            explanation=f"{node.id} {what} after {after}",
            log_tail=node.daemon.log()[-3000:],
        )
        node.daemon.kill()

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

    async def _leader_keeper(self, fault: Fault) -> tuple[Node, int | None]:
        """The fault's node and its keeper (None if it runs no command now), noted."""
        node = self._node(fault)
        fault.params["keeper"] = keeper = await _keeper_of(node.daemon.pid)
        return node, keeper

    async def _fault_keeper_sigkill(self, fault: Fault) -> None:
        """SIGKILL the leader's keeper: the command's whole tree (its setsid worker too) must
        die with it, and the daemon must call it an internal failure (exit 1), releasing only
        once the tree is gone. Restarted after 0.2-2 s."""
        node, keeper = await self._leader_keeper(fault)
        if keeper is None:
            return
        node.down = True
        os.kill(keeper, signal.SIGKILL)
        code = await node.exited(15)
        fault.params["exit_code"] = code
        after = "its keeper was killed (an internal failure: exit 1)"
        self._check_exit(node, fault, code, 1, "keeper_sigkill_exit", after)
        fault.params["restart_after_s"] = delay = round(self.rng.uniform(0.2, 2.0), 3)
        self._spawn(self._restart_later(node, delay))

    async def _fault_keeper_sigstop(self, fault: Fault) -> None:
        """SIGSTOP the leader's keeper and make that leader step down (POST /resign): leaderd
        must end the tree (a setsid worker ignoring SIGTERM) itself before it releases.
        SIGCONT after a drawn pause, as for sigstop (if the keeper still exists)."""
        node, keeper = await self._leader_keeper(fault)
        if keeper is None:
            return
        fault.params["stopped_s"] = pause = round(self._pause(), 3)
        os.kill(keeper, signal.SIGSTOP)
        try:
            fault.params["resign_status"] = await node.poller.post("/resign")
            await asyncio.sleep(pause)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(keeper, signal.SIGCONT)
        fault.healed = time.monotonic()

    async def _fault_both_sigstop(self, fault: Fault) -> None:
        """SIGSTOP the leader and its keeper together (a debugger, a freezer on both): the
        guard of the command's tree must end it before the lease can expire (docs/run.md).
        SIGCONT after a drawn pause, as for sigstop, the keeper first."""
        node, keeper = await self._leader_keeper(fault)
        if keeper is None:
            return
        fault.params["stopped_s"] = pause = round(self._pause(), 3)
        node.stopped = True
        frozen = (node.daemon.pid, keeper)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(pause)
        finally:
            for pid in reversed(frozen):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            node.stopped = False
        fault.healed = time.monotonic()

    async def _fault_db_lock(self, fault: Fault) -> None:
        """Another process holds the SQLite write lock (a backup, a careless sqlite3 shell, a
        writer in BEGIN IMMEDIATE)."""
        fault.params["locked_s"] = hold = round(self.rng.uniform(0.2, 2 * self.s.ttl), 3)
        fault.params["begin"] = begin = self.rng.choice(("IMMEDIATE", "EXCLUSIVE"))
        path = os.path.join(self.workdir, "lease.db")
        locked, fault.healed = await asyncio.to_thread(_hold_write_lock, path, hold, begin)
        fault.injected = locked

    async def _fault_duplicate_node_id(self, fault: Fault) -> None:
        """A second daemon with the target's node id (a copied config, two pods of one name)
        runs for a while: it must never lead beside the first (rule 9)."""
        target = self._node(fault)
        fault.params["twin_s"] = pause = round(self.rng.uniform(0.5, 2 * self.s.ttl), 3)
        daemon = self._daemon(f"{target.id}-twin", target.daemon.backend)
        daemon.args += ["--node-id", target.id]  # the last --node-id wins
        twin = Node(daemon, None, self.obs, self.s)
        daemon.start()
        twin.poller.start()
        twin.watcher.start()
        await asyncio.sleep(pause)
        daemon.signal(signal.SIGTERM)
        if await twin.exited(15) is None:
            daemon.kill()
        await twin.poller.close()
        await twin.watcher.close()
        fault.healed = time.monotonic()

    async def _fault_file_replaced(self, fault: Fault) -> None:
        """An operator deletes the lease file under running daemons, then restarts them one
        by one: nobody may lead on the deleted file beside a leader on the new one."""
        path = os.path.join(self.workdir, "lease.db")
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + suffix)
        await asyncio.sleep(self.rng.uniform(0.2, self.s.ttl))
        for node in self.nodes:
            if node.daemon.alive() and not node.stopped and not node.down:
                node.down = True
                node.daemon.signal(signal.SIGTERM)
                if await node.exited(15) is None:
                    node.daemon.kill()
                self._restart(node)
        fault.healed = time.monotonic()

    async def _fault_pg_crash(self, fault: Fault) -> None:
        """PostgreSQL dies without a checkpoint (pg_ctl -m immediate) while its default is
        synchronous_commit=off: commits not yet written are lost, unless leaderd's lease
        statements commit durably (docs/postgresql.md)."""
        assert self.pg is not None
        await asyncio.to_thread(self.pg.stop, "immediate")
        fault.params["down_s"] = down = round(self.rng.uniform(0.1, 1.0), 3)
        await asyncio.sleep(down)
        await asyncio.to_thread(self.pg.start)
        fault.healed = time.monotonic()

    async def _fault_clock_step(self, fault: Fault) -> None:
        """The server's clock steps forward (an NTP jump): every lease expires early on
        the server, and only the one-ttl takeover rule keeps a renewing leader's lease."""
        if not isinstance(self.pg, FakeTimeServer):
            return  # a shared server without libfaketime: nothing to step
        self.clock_offset += CLOCK_STEP
        fault.params["server_clock_offset_s"] = self.clock_offset
        await asyncio.to_thread(self.pg.step, self.clock_offset)
        fault.healed = time.monotonic()

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


async def _keeper_of(daemon: int, timeout: float = 1.0) -> int | None:
    """The live keeper of a supervising daemon, once there is one: not its startup probe,
    nor a keeper that just ended (a zombie child of the daemon for a moment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [pid for pid in children(daemon) if _is_live_keeper(pid)]
        if found:
            return found[0]
        await asyncio.sleep(0.02)
    return None


def _is_live_keeper(pid: int) -> bool:
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        return state != "Z" and b"--lifeline" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return False


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line contains ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and text.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
    return found


async def until(predicate: Callable[[], bool], deadline: float, interval: float = 0.01) -> bool:
    """Poll ``predicate`` (state many observers update) until true or the monotonic deadline."""
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)
    return True


def _hold_write_lock(path: str, hold: float, begin: str) -> tuple[float, float]:
    conn = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        conn.execute(f"BEGIN {begin}")
        locked = time.monotonic()
        time.sleep(hold)
        conn.execute("ROLLBACK")
        return locked, time.monotonic()
    finally:
        conn.close()
