"""Child supervision for `leaderd run -- COMMAND`: run the command only while this node leads.

leaderd does not start COMMAND itself but a small *keeper* (``python -I -S -c``, stdlib only)
in a session of its own; the keeper starts COMMAND in a new process group and stays its
parent. The keeper is what makes the guarantees hold when leaderd itself cannot act:

- it holds the read end of a *lifeline* pipe: when leaderd dies in any way (SIGKILL, crash,
  OOM) the pipe reads EOF and the keeper SIGKILLs the command's group and every descendant;
- leaderd writes each new lease deadline down the lifeline; if leaderd is frozen (SIGSTOP,
  a blocked loop) the keeper sends SIGTERM at ``deadline - kill_grace`` and SIGKILL at the
  deadline on its own (a dead man's switch on the host-wide monotonic clock);
- it is a child subreaper, so grandchildren that double-fork or leave the group are still
  its descendants and are killed and reaped with the command; COMMAND gets
  PDEATHSIG=SIGKILL relative to the keeper, which is single-threaded, so a ``preexec_fn``
  is safe there (it is not in leaderd, where aiosqlite runs a thread).

leaderd stays in charge: it tells the keeper to stop the child (SIGTERM), and at
``min(now + kill_grace, deadline)`` SIGKILLs the command's group itself, whatever the
keeper's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from . import limits
from .status import ElectionStatus, Role

if TYPE_CHECKING:
    from .engine import Election

log = logging.getLogger("leaderd.supervisor")

_POLL = 0.1  # how often the lease deadline is re-read and passed on to the keeper
_START_TIMEOUT = 30.0  # the keeper is a fresh interpreter: slow on a loaded host
_BACKOFF_FIRST, _BACKOFF_MAX = 1.0, 30.0


class ChildStartError(Exception):
    """COMMAND cannot be started (not found, not executable); the daemon exits 2."""


class Supervisor:
    """Starts COMMAND when this node leads, stops it before the lease can expire."""

    def __init__(
        self,
        command: list[str],
        election: Election,
        *,
        kill_grace: float,
        on_exit: str = "release",
        socket_path: str = "",
    ) -> None:
        self.command = command
        self.kill_grace = kill_grace
        self.on_exit = on_exit
        self._election = election
        self._socket_path = socket_path
        self._child: _Child | None = None
        self._stop_reason: str | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._wake = asyncio.Event()
        election.add_listener(self._on_change)

    async def run(self) -> int | None:
        """Supervise until cancelled. Returns the exit code for the daemon when the child
        exited on its own and on_exit is release; raises ChildStartError if it cannot start."""
        _check_command(self.command)
        backoff = _BACKOFF_FIRST
        while True:
            term, deadline = await self._until_leading()
            started = time.monotonic()
            code = await self._run_once(term, deadline)
            if code is None:
                continue
            how = _describe(code)
            if self.on_exit == "release":
                status = code if code >= 0 else 128 - code
                log.info(
                    "child %s; releasing election %s and exiting with status %d",
                    how,
                    self._election.name,
                    status,
                    extra={"event": "child_exited", "status": status},
                )
                return status
            if time.monotonic() - started >= _BACKOFF_MAX:
                backoff = _BACKOFF_FIRST
            log.info(
                "child %s; restarting it in %gs if still leader",
                how,
                backoff,
                extra={"event": "child_exited", "status": code},
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)

    async def stop_child(self, election: str) -> None:
        """The engine's step-down hook: the child is dead when this returns."""
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
        log.info("forwarding %s to child pid %d", name, child.pid)
        child.keeper.send_signal(signum)

    # ---- one child's life ----

    async def _until_leading(self) -> tuple[int, float]:
        """Wait until this node leads with more than kill_grace left: (term, deadline)."""
        while True:
            status = self._election.status()
            if status.valid_for is not None and status.valid_for > self.kill_grace:
                return status.term, time.monotonic() + status.valid_for
            # A late renewal moves no revision: poll while leading, else wait for a change.
            timeout = _POLL if status.is_leader else 5.0
            await self._election.wait_for_change(status.revision, timeout)

    async def _run_once(self, term: int, deadline: float) -> int | None:
        """Start the child and watch it: its exit code if it ended on its own, else None."""
        self._idle.clear()
        try:
            child = await self._start(term, deadline)
            self._child = child
            return await self._watch(child)
        finally:
            self._child, self._stop_reason = None, None
            self._idle.set()

    async def _start(self, term: int, deadline: float) -> _Child:
        env = {
            **os.environ,
            "LEADERD_ELECTION": self._election.name,
            "LEADERD_NODE_ID": self._election.candidate.node_id,
            "LEADERD_TERM": str(term),
            "LEADERD_SOCKET": self._socket_path,
        }
        child = _Child.spawn(self.command, env, term, deadline, self.kill_grace)
        error = await child.started()
        if error is not None:
            await child.reaped()
            raise ChildStartError(f"cannot start {shlex.join(self.command)}: {error}")
        log.info(
            "starting child '%s' (pid %d) for election %s, term %d",
            shlex.join(self.command),
            child.pid,
            self._election.name,
            term,
            extra={"event": "child_started", "pid": child.pid, "term": term},
        )
        return child

    async def _watch(self, child: _Child) -> int | None:
        while not child.exited.done():
            self._wake.clear()
            left = self._election.lease_left()
            if self._stop_reason is not None:
                reason = self._stop_reason
            elif left is None:
                reason = "lost leadership"
            elif left <= self.kill_grace:
                reason = f"lease deadline in {left:.1f}s"
            else:
                child.extend(time.monotonic() + left)
                await child.nap(self._wake, min(left - self.kill_grace, _POLL))
                continue
            await self._stop(child, reason)
            return None
        code, why = await child.reaped()
        if why == "deadline":
            log.warning(
                "child pid %d %s: its keeper stopped it at the lease deadline, leaderd "
                "did not act in time",
                child.pid,
                _describe(code),
                extra={"event": "child_stopped", "pid": child.pid},
            )
            return None
        return code

    async def _stop(self, child: _Child, reason: str) -> None:
        log.info(
            "stopping child pid %d: %s",
            child.pid,
            reason,
            extra={"event": "child_stopping", "pid": child.pid, "reason": reason},
        )
        child.stop()
        # Dead before the lease can expire, even if the keeper is frozen: SIGKILL ourselves.
        kill_in = min(self.kill_grace, child.deadline - time.monotonic())
        if kill_in > 0 and await child.gone(timeout=kill_in):
            code, _ = await child.reaped()
        else:
            child.kill()
            code, _ = await child.reaped()
        log.info(
            "child pid %d %s",
            child.pid,
            _describe(code),
            extra={"event": "child_stopped", "pid": child.pid, "status": code},
        )

    def _on_change(self, _status: ElectionStatus) -> None:
        self._wake.set()


class _Child:
    """leaderd's end of one keeper: its lifeline, its reports, its exit."""

    def __init__(
        self, keeper: subprocess.Popen[bytes], lifeline: int, report: int, deadline: float
    ) -> None:
        self.keeper = keeper
        self.pid = 0  # the command's pid, which is also its process group
        self.deadline = deadline
        self.stopping = False
        self._lifeline = lifeline
        self._report = report
        self._buffer = b""
        self._error: str | None = None
        self._exit: tuple[int, str] | None = None
        loop = asyncio.get_running_loop()
        self._reported: asyncio.Future[None] = loop.create_future()
        # Done once the keeper has exited and its last report is read.
        self.exited: asyncio.Future[None] = loop.create_future()
        self._pidfd = os.pidfd_open(keeper.pid)
        self._open = {report, self._pidfd}
        os.set_blocking(report, False)
        os.set_blocking(lifeline, False)
        loop.add_reader(report, self._on_report)
        loop.add_reader(self._pidfd, self._closed, self._pidfd)

    @classmethod
    def spawn(
        cls, command: list[str], env: dict[str, str], term: int, deadline: float, grace: float
    ) -> _Child:
        life_r, life_w = os.pipe()
        report_r, report_w = os.pipe()
        args = [str(life_r), str(report_w), repr(deadline), repr(grace), *command]
        try:
            keeper = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _keeper_source(), *args],
                env=env,
                pass_fds=(life_r, report_w),
                start_new_session=True,  # off leaderd's terminal: Ctrl-C reaches leaderd only
            )
        except BaseException:
            for fd in (life_w, report_r):
                os.close(fd)
            raise
        finally:
            os.close(life_r)
            os.close(report_w)
        # The daemon lifted its open-file limit for watchers; the command gets the one it
        # was started with (the keeper is still starting Python: it forks nothing yet).
        limits.restore(keeper.pid)
        return cls(keeper, life_w, report_r, deadline)

    async def started(self) -> str | None:
        """Wait for the keeper's first report: None once COMMAND runs, else why not."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reported), _START_TIMEOUT)
        if self.pid == 0 and self._error is None:
            self.keeper.kill()
            return f"its keeper did not report within {_START_TIMEOUT:g}s"
        return self._error

    def extend(self, deadline: float) -> None:
        """Pass a later lease deadline on to the keeper's dead man's switch."""
        if deadline > self.deadline + 0.001 and not self.stopping:
            self.deadline = deadline
            self._tell(f"deadline {deadline!r}")

    def stop(self) -> None:
        """Ask the keeper for SIGTERM to the group now, SIGKILL at min(grace, deadline)."""
        self.stopping = True
        self._tell("stop")

    def kill(self) -> None:
        self.stopping = True
        if self.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        self._tell("stop")

    async def nap(self, wake: asyncio.Event, timeout: float) -> None:
        waiter: asyncio.Future[object] = asyncio.ensure_future(wake.wait())
        exited: asyncio.Future[object] = asyncio.ensure_future(asyncio.shield(self.exited))
        await asyncio.wait([waiter, exited], timeout=timeout)
        waiter.cancel()
        exited.cancel()

    async def gone(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.exited), timeout)
        return self.exited.done()

    async def reaped(self) -> tuple[int, str]:
        """Once the keeper is gone: (the command's exit code, why it ended). The code is
        negative for a signal, as in subprocess."""
        if not await self.gone(timeout=1.0):
            # A frozen keeper cannot reap: it goes, and the command's group with it.
            self.kill()
            self.keeper.kill()
            await self.gone(timeout=_START_TIMEOUT)
        self.keeper.wait()  # exited: its pidfd said so, this does not block
        with contextlib.suppress(OSError):
            os.close(self._lifeline)
        if self._exit is not None:
            return self._exit
        if self.pid:  # the keeper died unreported: make sure nothing of the child lives on
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        return self.keeper.returncode, "keeper died"

    def _tell(self, line: str) -> None:
        with contextlib.suppress(OSError):  # a full pipe or a gone keeper: SIGKILL still works
            os.write(self._lifeline, f"{line}\n".encode())

    def _on_report(self) -> None:
        try:
            data = os.read(self._report, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            word, _, rest = line.decode(errors="replace").partition(" ")
            if word == "pid":
                self.pid = int(rest)
            elif word == "error":
                self._error = rest
            elif word == "exit":
                code, _, why = rest.partition(" ")
                self._exit = int(code), why
            if not self._reported.done():
                self._reported.set_result(None)
        if not data:
            if not self._reported.done():
                self._reported.set_result(None)
            self._closed(self._report)

    def _closed(self, fd: int) -> None:
        asyncio.get_running_loop().remove_reader(fd)
        os.close(fd)
        self._open.discard(fd)
        if not self._open and not self.exited.done():
            self.exited.set_result(None)


def _check_command(command: list[str]) -> None:
    """Fail at startup, not at the first failover, when COMMAND cannot run."""
    program = command[0]
    path = program if "/" in program else shutil.which(program)
    if path is None or not os.path.exists(path):
        raise ChildStartError(f"cannot start {shlex.join(command)}: {program}: command not found")
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise ChildStartError(f"cannot start {shlex.join(command)}: {program}: not executable")


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


_source: str | None = None


def _keeper_source() -> str:
    global _source
    if _source is None:
        _source = inspect.getsource(_keeper) + "\n_keeper()\n"
    return _source


def _keeper() -> None:  # pragma: no cover - runs in its own interpreter, see the module doc
    """argv: LIFELINE_FD REPORT_FD DEADLINE GRACE COMMAND...; reports "pid N", "error WHY"
    and "exit CODE WHY" on REPORT_FD; reads "deadline T" and "stop" from LIFELINE_FD."""
    import contextlib
    import ctypes
    import math
    import os
    import select
    import signal
    import subprocess
    import sys
    import time

    life, report = int(sys.argv[1]), int(sys.argv[2])
    deadline, grace = float(sys.argv[3]), float(sys.argv[4])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphaned descendants stay ours
    me, pid, status = os.getpid(), 0, None

    def tell(line: str) -> None:
        with contextlib.suppress(OSError):
            os.write(report, f"{line}\n".encode())

    def in_child() -> None:
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the keeper
        if os.getppid() != me:
            os._exit(1)

    def forward(signum: int, _frame: object) -> None:
        if pid and status is None:
            os.kill(pid, signum)

    def descendants() -> list[int]:
        found: list[int] = []
        todo = [me]
        while todo:
            parent = todo.pop()
            with contextlib.suppress(OSError):
                for task in os.listdir(f"/proc/{parent}/task"):
                    with open(f"/proc/{parent}/task/{task}/children") as f:
                        kids = [int(k) for k in f.read().split()]
                    found += kids
                    todo += kids
        return found

    def signal_all(signum: int) -> None:
        with contextlib.suppress(OSError):
            os.killpg(pid, signum)
        for other in descendants():
            with contextlib.suppress(OSError):
                os.kill(other, signum)

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _s, _f: None)  # leaderd says when to stop, on the lifeline
    for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    try:
        pid = subprocess.Popen(sys.argv[5:], process_group=0, preexec_fn=in_child).pid
    except OSError as exc:
        tell(f"error {exc.strerror or exc}")
        os._exit(127)
    tell(f"pid {pid}")
    why, stopping, orphaned = "exited", False, False
    kill_at, buffer = math.inf, b""
    while True:
        children = True
        while children:
            try:
                reaped, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children = False
                break
            if reaped == 0:
                break
            if reaped == pid:
                status = wait_status
        if status is not None and not children:
            break
        now = time.monotonic()
        term_at = deadline - grace + min(0.25, grace / 4)  # leaderd normally says "stop" first
        if not stopping and (status is not None or now >= term_at):
            why = "exited" if status is not None else "deadline"
            stopping, kill_at = True, min(now + grace, deadline)
            signal_all(signal.SIGTERM)
        if now >= kill_at:
            signal_all(signal.SIGKILL)
            kill_at = now + 0.1  # again, for any process forked meanwhile
        wait = min(kill_at if stopping else term_at, now + 1.0) - now
        fds = [wake_r] if orphaned else [wake_r, life]
        ready, _, _ = select.select(fds, [], [], max(0.0, wait))
        if wake_r in ready:
            os.read(wake_r, 4096)
        if life not in ready:
            continue
        data = os.read(life, 4096)
        if not data:  # leaderd is gone: nobody supervises this child any more
            why, stopping, orphaned, kill_at = "orphaned", True, True, now
            continue
        *lines, buffer = (buffer + data).split(b"\n")
        for line in lines:
            if line.startswith(b"deadline ") and not stopping:
                deadline = float(line.split()[1])
            elif line == b"stop" and not stopping:
                why, stopping, kill_at = "stop", True, min(now + grace, deadline)
                signal_all(signal.SIGTERM)
    assert status is not None
    code = os.waitstatus_to_exitcode(status)
    tell(f"exit {code} {why}")
    os._exit(code if code >= 0 else 128 - code)
