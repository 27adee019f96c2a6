"""Child supervision for `leaderd run -- COMMAND`: run the command only while this node leads.

Policy only: when to start the command, when it must stop, what its end means. leaderd
does not start COMMAND itself but a *keeper* (keeper.py), which holds the command's
whole process tree in a PID namespace, a cgroup or a process group (containment.py)
and ends it on its own if leaderd dies or freezes; child.py is leaderd's end of it.

The command runs only while this node leads with more than ``kill_grace`` left on the lease,
read from the engine at every check (``Election.lease_deadline()``, CLOCK_BOOTTIME). It is
stopped (SIGTERM, then SIGKILL at ``min(now + kill_grace, deadline)``) when leadership is
lost or about to be, and when the term changes under it (its ``LEADERD_TERM`` would be
stale). A keeper that dies is an internal failure, never the command's exit: leaderd ends
what the keeper held, and releases nothing before all of it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import signal
from typing import TYPE_CHECKING

from ..clock import boottime
from ..election.status import ElectionStatus, Role
from ..events import Event, extra
from .child import KEEPER_DIED, Child
from .containment_probe import START_TIMEOUT, Plan, plan
from .keeper_protocol import DEADLINE_PASSED, EXITED, GUARDED, LOST, STOPPED

if TYPE_CHECKING:
    from ..election.engine import Election

log = logging.getLogger("leaderd.supervisor")

_POLL = 0.1  # how often the lease deadline is re-read and passed on to the keeper
_BACKOFF_FIRST, _BACKOFF_MAX = 1.0, 30.0
# run --exit-status fixed: whatever status the child failed with.
EXIT_CHILD_FAILED = 3
# Who stopped the child at the lease deadline when leaderd did not (docs/run.md).
_LATE = {
    DEADLINE_PASSED: "its keeper stopped it at the lease deadline, leaderd did not act in time",
    GUARDED: "the guard of its process tree stopped it at the lease deadline, neither "
    "leaderd nor its keeper acted in time",
}


class ChildStartError(Exception):
    """COMMAND cannot be started (not found, not executable); the daemon exits 2."""


class SupervisionError(Exception):
    """The command's keeper failed (an internal failure); its whole tree is gone."""


class Supervisor:
    """Starts COMMAND when this node leads, stops it before the lease can expire."""

    def __init__(
        self,
        command: list[str],
        election: Election,
        *,
        kill_grace: float,
        on_exit: str = "release",
        fixed_status: bool = False,
        socket_path: str = "",
    ) -> None:
        self.command = command
        self.kill_grace = kill_grace
        self.on_exit = on_exit
        self.fixed_status = fixed_status
        self._election = election
        self._socket_path = socket_path
        self._plan = Plan("session", ("session",))
        self._child: Child | None = None
        self._stop_reason: str | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._wake = asyncio.Event()
        self.child_env: dict[str, str] = {}  # more of the child's environment (once_per.py)
        election.add_listener(self._on_change)

    async def run(self) -> int | None:
        """Supervise until cancelled. Returns the exit code for the daemon when the child
        exited on its own and on_exit is release; raises ChildStartError if it cannot start,
        SupervisionError if its keeper failed."""
        _check_command(self.command)
        self._plan = await plan()
        try:
            return await self._supervise()
        finally:
            if self._plan.cgroup:
                with contextlib.suppress(OSError):  # busy if something still runs in it
                    os.rmdir(self._plan.cgroup)

    async def _supervise(self) -> int | None:
        backoff = _BACKOFF_FIRST
        while True:
            term, deadline = await self._until_leading()
            started = boottime()
            code = await self._run_once(term, deadline)
            if code is None:
                continue
            how = _describe(code)
            if self.on_exit == "release":
                status = code if code >= 0 else 128 - code
                if self.fixed_status and status:  # never read as leaderd's own 1 or 2
                    status = EXIT_CHILD_FAILED
                log.info(
                    "child %s; releasing election %s and exiting with status %d",
                    how,
                    self._election.name,
                    status,
                    extra=extra(Event.CHILD_EXITED, status=status),
                )
                return status
            if boottime() - started >= _BACKOFF_MAX:
                backoff = _BACKOFF_FIRST
            log.info(
                "child %s; restarting it in %gs if still leader",
                how,
                backoff,
                extra=extra(Event.CHILD_EXITED, status=code),
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)

    async def stop_child(self, election: str) -> None:
        """The engine's step-down hook: the child's whole tree is gone when this returns."""
        if self._idle.is_set():
            return
        stopped = self._election.status().role is Role.STOPPED
        self._stop_reason = "shutting down" if stopped else "stepping down"
        self._wake.set()
        await self._idle.wait()

    def forward(self, signum: int) -> None:
        """Pass SIGHUP/SIGUSR1/SIGUSR2 to the child (through its keeper, which knows
        whether the pid is still the child's)."""
        name = signal.Signals(signum).name
        child = self._child
        if child is None or child.stopping:
            log.info("received %s: no child running, ignored", name)
            return
        log.info("forwarding %s to child %s", name, child.name)
        child.forward(signum)

    # ---- one child's life ----

    async def _until_leading(self) -> tuple[int, float]:
        """Wait until this node leads with more than kill_grace left: (term, deadline)."""
        while True:
            lease = self._election.lease_deadline()
            if lease is not None and lease[1] - boottime() > self.kill_grace:
                return lease
            status = self._election.status()
            # A late renewal moves no revision: poll while leading, else wait for a change.
            timeout = _POLL if status.is_leader else 5.0
            await self._election.wait_for_change(status.revision, timeout)

    async def _run_once(self, term: int, deadline: float) -> int | None:
        """Start the child and watch it: its exit code if it ended on its own, else None."""
        self._idle.clear()
        try:
            child = self._child = self._spawn(term, deadline)
            return await self._watch(child)
        finally:
            self._child, self._stop_reason = None, None
            self._idle.set()

    def _spawn(self, term: int, deadline: float) -> Child:
        env = {
            **os.environ,
            "LEADERD_ELECTION": self._election.name,
            "LEADERD_NODE_ID": self._election.candidate.node_id,
            "LEADERD_TERM": str(term),
            "LEADERD_SOCKET": self._socket_path,
            **self.child_env,
        }
        return Child.spawn(self.command, env, term, deadline, self.kill_grace, self._plan.contain)

    async def _watch(self, child: Child) -> int | None:
        """Watch the lease for the child's whole life, from its keeper's first instant: a
        keeper that has not yet said the command runs may have started it already."""
        spawned, announced = boottime(), False
        while not child.exited.done():
            self._wake.clear()
            if child.running and not announced:
                announced = self._announce(child)
            elif not child.reported.done() and boottime() - spawned > START_TIMEOUT:
                child.lost = f"said nothing in {START_TIMEOUT:g}s"
                child.kill_keeper()
            reason, left = self._check(child)
            if reason is not None:
                await self._stop(child, reason)
                return None
            await child.nap(self._wake, min(left - self.kill_grace, _POLL))
        return await self._ended(child)

    def _announce(self, child: Child) -> bool:
        if child.grip.mode != self._plan.mode:
            log.warning(
                "child pid %d is contained by %s, not %s: %s",
                child.pid,
                child.grip.mode,
                self._plan.mode,
                "; ".join(f"{mode}: {why}" for mode, why in child.skipped),
                extra=extra(Event.CONTAINMENT, mode=child.grip.mode),
            )
        log.info(
            "starting child '%s' (pid %d) for election %s, term %d",
            shlex.join(self.command),
            child.pid,
            self._election.name,
            child.term,
            extra=extra(Event.CHILD_STARTED, pid=child.pid, term=child.term),
        )
        return True

    def _check(self, child: Child) -> tuple[str | None, float]:
        """Why the child must stop now, if it must; else pass the deadline on to its keeper
        and say how long the lease has left."""
        if self._stop_reason is not None:
            return self._stop_reason, 0.0
        lease = self._election.lease_deadline()
        if lease is None:  # a stop may be seen here before its step-down hook tells us
            stopping = self._election.status().role is Role.STOPPED
            return ("shutting down" if stopping else "lost leadership"), 0.0
        term, deadline = lease
        if term != child.term:  # its LEADERD_TERM would be stale: fenced writes must fail
            return f"the term changed from {child.term} to {term}", 0.0
        left = deadline - boottime()
        if left <= self.kill_grace:
            return f"lease deadline in {left:.1f}s", left
        child.extend(deadline)
        return None, left

    async def _ended(self, child: Child) -> int | None:
        """The keeper ended without being told to: the command exited (or could not start),
        its keeper stopped it at the deadline, or something failed."""
        code, why = await child.outcome()
        if child.error is not None:
            raise ChildStartError(f"cannot start {shlex.join(self.command)}: {child.error}")
        if why in _LATE:
            _log_stopped(child, code, why)
            return None
        if why != EXITED or not child.running:
            self._failed(child, code, why)
        return code

    async def _stop(self, child: Child, reason: str) -> None:
        log.info(
            "stopping child %s: %s",
            child.name,
            reason,
            extra=extra(Event.CHILD_STOPPING, pid=child.pid, reason=reason),
        )
        child.stop()
        # Dead before the lease can expire, even if the keeper is frozen: leaderd kills it.
        await child.finish(min(self.kill_grace, child.deadline - boottime()))
        code, why = await child.outcome()
        ours = why == LOST and child.killed_tree  # the init leaderd itself killed
        if why not in (STOPPED, EXITED, *_LATE) and not ours:
            self._failed(child, code, why)
        _log_stopped(child, code, why)

    def _failed(self, child: Child, code: int, why: str) -> None:
        """The keeper, or the init of the command's namespace, died under it: whatever held
        the tree failed, not the command. Its tree is gone by now (Child.outcome)."""
        if not child.running:
            message = f"the keeper (pid {child.keeper.pid}) {child.lost or 'ended'} before "
            message += "the child ran"
        else:
            what = "keeper" if why in (KEEPER_DIED, STOPPED) else f"containment ({why})"
            message = f"the {what} of child pid {child.pid} {_describe(code)}"
        log.error(
            "internal failure: %s; the child's whole tree is gone, nothing was released before",
            message,
            extra=extra(Event.KEEPER_DIED, pid=child.pid, status=code, reason=why),
        )
        raise SupervisionError(message)

    def _on_change(self, _status: ElectionStatus) -> None:
        self._wake.set()


def _check_command(command: list[str]) -> None:
    """Fail at startup, not at the first failover, when COMMAND cannot run."""
    program = command[0]
    path = program if "/" in program else shutil.which(program)
    if path is None or not os.path.exists(path):
        raise ChildStartError(f"cannot start {shlex.join(command)}: {program}: command not found")
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise ChildStartError(f"cannot start {shlex.join(command)}: {program}: not executable")


def _log_stopped(child: Child, code: int, why: str) -> None:
    fields = extra(Event.CHILD_STOPPED, pid=child.pid, status=code)
    if why in _LATE:
        log.warning("child %s %s: %s", child.name, _describe(code), _LATE[why], extra=fields)
    else:
        log.info("child %s %s", child.name, _describe(code), extra=fields)


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"
