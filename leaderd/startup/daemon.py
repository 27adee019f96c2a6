"""Daemon wiring: backend, elections, HTTP listeners, systemd, signals and ordered shutdown.

Shutdown order (docs/algorithm.md), bounded by shutdown_timeout: STOPPING=1, publish
"stopped" to every watcher, stop the supervised child, release each lease (which
wakes the standbys), close the listeners, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from aiohttp import web

from .. import __version__, held_logs
from ..api.connections import Limits
from ..api.health_metrics import HealthCollector
from ..api.listener import SocketInUse, SocketPathError, UnixListener
from ..api.metrics import Metrics
from ..api.sites import Sites
from ..backends import Backend, BackendFatal, BackendUnavailable, Candidate, backend_from_url
from ..election.candidacy import Failback
from ..election.engine import Election
from ..election.node import Node
from ..events import Event, extra
from ..supervision import hooks
from ..supervision.health import Health
from ..supervision.limits import raise_open_files
from . import early_signals, memory
from .config import Config
from .systemd import Notifier, listen_fds

log = logging.getLogger("leaderd")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
# run --try: not leader within the time given (sysexits' EX_TEMPFAIL: try again later).
EXIT_NOT_LEADING = 75
_SPAWN_RETRY = 1.0  # first wait after the child could not be started (EMFILE, EAGAIN)
_RECORD = "the record of run --once-per"  # what /ready names while the job store opens


@dataclass(frozen=True)
class Job:
    """run -- COMMAND: the command, --try's time (None: campaign for ever) and whether
    --exit-status fixed folds the child's failures into one status."""

    command: list[str]
    try_for: float | None = None
    fixed_status: bool = False
    once_per: float | None = None  # run --once-per PERIOD (once_per.py)
    catch_up: bool = False


class Daemon:
    def __init__(self, config: Config, job: Job | None = None) -> None:
        self.config = config
        self.job = job
        self.notifier = Notifier()
        self.metrics = Metrics()
        self.exit_code = EXIT_OK
        self._stop = asyncio.Event()
        # Every resource registers its own teardown here as it is set up (aiohttp's
        # cleanup_ctx habit): torn down in reverse order, whatever way run() ends.
        self._teardown = contextlib.AsyncExitStack()
        self._unix: UnixListener | None = None
        self._activated: list[socket.socket] = []
        self._ready_sent = False
        self._forward: Callable[[int], None] | None = None
        self._signals = 0
        self._node: Node | None = None
        self._stopping_sent = False
        self._health = Health()  # the health checks of every election (--check)

    async def run(self) -> int:
        """Serve until a signal (or the supervised child) ends it; return the exit code."""
        cfg = self.config
        open_files = raise_open_files()
        self._install_signal_handlers()  # before the socket exists: a stop is never lost
        async with self._teardown:
            self._teardown.callback(held_logs.release)  # the last step: no kept line is lost
            self._teardown.callback(self.notifier.close)
            try:
                self._unix = self._bind_unix()
            except (SocketInUse, SocketPathError) as exc:
                log.error("%s", exc, extra=extra(Event.SOCKET_ERROR))
                return EXIT_USAGE
            _announce(self._unix.path, open_files)  # the curl it suggests now answers
            self._teardown.callback(self._unix.remove)
            backend = self.metrics.wrap(backend_from_url(cfg.backend))
            if self.job is not None:
                backend.ttl_rule_only()  # the command may outlive this process's death
            self._teardown.push_async_callback(_quietly, backend.close)
            if not await self._open_backend(backend):
                return EXIT_FAILURE
            node = self._build_node(backend)
            try:
                await self._serve(node)
            except SocketPathError as exc:
                log.error("%s", exc, extra=extra(Event.SOCKET_ERROR))
                return EXIT_USAGE
            tasks = [asyncio.create_task(e.run()) for e in node.elections.values()]
            helpers = self._start_helpers(node)
            await self._until_stopped(tasks + helpers)
            await self._shut_down(node, tasks, helpers)
        return self.exit_code

    def request_stop(self, exit_code: int = EXIT_OK) -> None:
        if not self._stop.is_set():
            self.exit_code = exit_code
            self._stop.set()

    async def _open_backend(self, backend: Backend) -> bool:
        names = [e.name for e in self.config.elections]
        try:
            if self.config.state_dir:
                os.makedirs(self.config.state_dir, mode=0o750, exist_ok=True)
            await backend.open(names)
        except BackendFatal as exc:
            log.error("cannot use backend %s: %s", backend.description, exc)
            return False
        except OSError as exc:
            log.error("cannot create state directory %s: %s", self.config.state_dir, exc.strerror)
            return False
        except BackendUnavailable as exc:
            log.warning(
                "backend %s unreachable at start (%s); retrying in every round",
                backend.description,
                exc,
            )
        log.info("backend %s, elections %s", backend.description, ", ".join(names))
        return True

    def _build_node(self, backend: Backend) -> Node:
        cfg = self.config
        candidate, health = Candidate(cfg.node_id, cfg.address), self._health
        elections = {}
        for e in cfg.elections:
            me = replace(candidate, priority=e.eligibility.priority)
            election = elections[e.name] = Election(e.name, me, e.timing, backend)
            election.on_unhealthy = e.eligibility.on_unhealthy
            election.failback = Failback(e.eligibility.failback)
            election.unhealthy = health.attach(e.name, e.eligibility.checks, election.poke)
        node = Node(cfg.node_id, backend, elections, health.describe)
        self._node = node
        self.metrics.watch(node)
        self.metrics.registry.register(HealthCollector(health))
        for election in elections.values():
            election.add_listener(lambda _status: self._on_change(node))
        return node

    def _on_change(self, node: Node) -> None:
        if node.ready and not self._ready_sent:
            self._ready_sent = True
            self.notifier.ready(node.summary())
            log.info("ready: %s", node.summary(), extra=extra(Event.READY))
            asyncio.get_running_loop().call_soon(memory.settle)  # start-up's garbage, once
        elif self.notifier.enabled:
            self.notifier.status(node.summary())

    async def _serve(self, node: Node) -> None:
        """The read-write API on the Unix socket; the read-only one on any TCP listener."""
        cfg = self.config
        assert self._unix is not None
        limits = Limits(cfg.max_connections, cfg.header_timeout, cfg.keepalive_timeout)
        sites = Sites(node, self.metrics, limits, self._runner)
        await sites.open(self._unix.sock, self._activated, cfg.listen)

    def _bind_unix(self) -> UnixListener:
        """The socket systemd passed us (socket activation), else our own at cfg.socket."""
        self._activated = listen_fds()
        unix = [s for s in self._activated if s.family == socket.AF_UNIX]
        if unix:
            return UnixListener.adopt(unix[0])
        return UnixListener.bind(self.config.socket, self.config.socket_mode)

    def _start_helpers(self, node: Node) -> list[asyncio.Task[None]]:
        helpers = []
        if self._health.checks:
            helpers.append(asyncio.create_task(self._health.run()))
        if self.notifier.watchdog_interval:
            helpers.append(
                asyncio.create_task(self._watchdog(node, self.notifier.watchdog_interval))
            )
        hooked = [(node.elections[e.name], e.hooks) for e in self.config.elections]
        helpers += hooks.start(hooked, self.metrics.registry)
        if self.job is not None:
            if self.job.once_per is not None:
                node.opening.add(_RECORD)  # not ready before: no run could be recorded
            helpers.append(asyncio.create_task(self._supervise(node, self.job)))
        if self.job is not None and self.job.try_for is not None:
            helpers.append(
                asyncio.create_task(self._give_up_unless_leading(node, self.job.try_for))
            )
        if self.config.label_pod is not None:
            # Created after _supervise: its step-down hook (stop the command) is set first,
            # and the label's removal follows it, both before the release.
            helpers.append(asyncio.create_task(self._label_pod(node, self.config.label_pod)))
        return helpers

    async def _label_pod(self, node: Node, label: tuple[str, str]) -> None:
        from ..backends.kubernetes.pod_label import label_pod

        election = node.election(None)
        assert election is not None  # config: the only election, or default
        try:
            await label_pod(self.config.backend, label, election)
        except BackendFatal as exc:
            log.error("--label-pod: %s", exc)
            self.request_stop(EXIT_FAILURE)

    async def _give_up_unless_leading(self, node: Node, try_for: float) -> None:
        """--try: stop, exit 75, unless this node leads within try_for of the start."""
        election = node.election(None)
        assert election is not None
        led = asyncio.Event()
        election.add_listener(lambda status: led.set() if status.is_leader else None)
        if election.status().is_leader:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(led.wait(), try_for)
        if not led.is_set() and not election.status().is_leader:
            log.info("not leader of election %s within %gs (--try): giving up",
                     election.name, try_for)  # fmt: skip
            self.request_stop(EXIT_NOT_LEADING)

    async def _supervise(self, node: Node, job: Job) -> None:
        from ..supervision.supervisor import ChildStartError, Supervisor
        from .job_wiring import open_runner

        election = node.election(None)
        assert election is not None  # config makes run -- COMMAND take one election
        socket_path = self._unix.path if self._unix else self.config.socket
        supervisor: Supervisor | None
        if job.once_per is not None:
            supervisor = await open_runner(self.config, election, job, socket_path, self.metrics,
                                           node, self._teardown)  # fmt: skip
            if supervisor is None:
                self.request_stop(EXIT_FAILURE)
                return
            node.opening.discard(_RECORD)
            self._on_change(node)  # the elections may have been ready for a while
        else:
            supervisor = Supervisor(job.command, election, kill_grace=self.config.kill_grace,
                                    on_exit=self.config.on_exit, fixed_status=job.fixed_status,
                                    socket_path=socket_path)  # fmt: skip
        election.step_down_hook = hooks.before(supervisor.stop_child, election.step_down_hook)
        self._forward = supervisor.forward
        retry = _SPAWN_RETRY
        while True:
            try:
                code = await supervisor.run()
            except ChildStartError as exc:
                log.error("%s", exc, extra=extra(Event.CHILD_FAILED, reason=str(exc)))
                self.request_stop(EXIT_USAGE)
                return
            except OSError as exc:
                # Out of files or processes for a moment: the host's trouble, not the
                # command's; the lease is still ours, so try again rather than exit.
                why = exc.strerror or str(exc)
                log.error("cannot start the child: %s; trying again in %gs", why, retry,
                          extra=extra(Event.CHILD_FAILED, reason=why))  # fmt: skip
                await asyncio.sleep(retry)
                retry = min(retry * 2, 30.0)
                continue
            if code is not None:
                self.request_stop(code)
            return

    async def _watchdog(self, node: Node, interval: float) -> None:
        """Ping systemd only while every election loop turns: a stall gets us restarted."""
        while True:
            reason = node.health()
            if reason is None:
                self.notifier.watchdog()
            else:
                log.warning("withholding watchdog ping: %s", reason)
            await asyncio.sleep(interval)

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_stop_signal, signum)
        for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            loop.add_signal_handler(signum, self._on_forward_signal, signum)
        for held in early_signals.pending():  # came while the daemon was starting
            self._on_stop_signal(held)

    def _on_stop_signal(self, signum: int) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            held_logs.hold()  # until the release has its answer (held_logs.py)
            fields = extra(Event.STOPPING, signal=name)
            held_logs.log(log, logging.INFO, "received %s: handing over", name, extra=fields)
            # The hand-over starts in this very callback, not a loop turn or two later.
            self._stop_elections()
            self.request_stop(EXIT_OK)
        else:
            # A second signal must not skip the release: the hand-over is bounded anyway.
            log.info(
                "received %s again: still handing over, at most %gs",
                name,
                self.config.shutdown_timeout,
            )

    def _stop_elections(self) -> None:
        """STOPPING=1, then publish "stopped" in every election and wake its loop to hand
        over (rule 7, docs/algorithm.md); idempotent."""
        if self._node is None or self._stopping_sent:
            return
        self._stopping_sent = True
        self.notifier.stopping("handing over")
        for election in self._node.elections.values():
            election.stop()

    def _on_forward_signal(self, signum: int) -> None:
        if self._forward is not None:
            self._forward(signum)

    async def _until_stopped(self, tasks: list[asyncio.Task[None]]) -> None:
        stop = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stop and not task.cancelled() and task.exception():
                log.error("internal failure: %r", task.exception(), exc_info=task.exception())
                self.request_stop(EXIT_FAILURE)
        stop.cancel()

    async def _shut_down(
        self, node: Node, tasks: list[asyncio.Task[None]], helpers: list[asyncio.Task[None]]
    ) -> None:
        self._stop_elections()
        timeout = self.config.shutdown_timeout
        try:
            async with asyncio.timeout(timeout):
                ended = await asyncio.gather(*tasks, return_exceptions=True)
            for failure in (e for e in ended if isinstance(e, Exception)):
                log.error("internal failure while handing over: %r", failure, exc_info=failure)
                self.exit_code = self.exit_code or EXIT_FAILURE
        except TimeoutError:
            log.error("hand-over took longer than shutdown_timeout (%gs); exiting anyway", timeout)
            self.exit_code = self.exit_code or EXIT_FAILURE
        for task in (*tasks, *helpers):
            task.cancel()
        await asyncio.gather(*tasks, *helpers, return_exceptions=True)
        held_logs.release()  # before the last line: nothing kept is lost
        log.info("exiting", extra=extra(Event.EXITED, status=self.exit_code))

    def _runner(self, runner: web.AppRunner) -> None:
        """A listener is served: its cleanup runs first at teardown (the last set up)."""
        self._teardown.push_async_callback(_quietly, runner.cleanup)


async def _quietly(close: Callable[[], Awaitable[None]]) -> None:
    """A teardown step that fails must not skip the ones after it."""
    with contextlib.suppress(Exception):
        await close()


def run(config: Config, job: Job | None = None) -> int:
    """Run the daemon on uvloop when available; return the process exit code."""
    daemon = Daemon(config, job)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(daemon.run())
    # asyncio.Runner rather than uvloop.run: uvloop < 0.18 (Debian 12) has no run().
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(daemon.run())


def _announce(sock_path: str, open_files: int) -> None:
    log.info(
        "leaderd %s on %s; try: curl --unix-socket %s http://localhost/leader",
        __version__,
        sock_path,
        sock_path,
        extra=extra(Event.STARTING, socket=sock_path),
    )
    log.debug("open-file limit %d", open_files)
