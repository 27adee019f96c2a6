"""One supervised command as leaderd sees it: its keeper, the keeper's reports, and leaderd's
own grip on the command's tree for when the keeper cannot act (docs/run.md, "Containment").

leaderd is a child subreaper: when a keeper dies, what it held becomes leaderd's, and leaderd
kills and reaps all of it before anything else happens. leaderd starts no other child
processes, so every child that is not the current keeper was adopted from one.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import select
import signal
import subprocess

from ..clock import boottime
from ..events import Event, extra
from . import limits
from .containment import (
    cgroup_empty,
    cgroup_kill,
    children,
    send,
    signal_tree,
)
from .containment_probe import keeper_argv
from .keeper_protocol import (
    CONTAINED,
    DEADLINE,
    ERROR,
    EXIT,
    PID,
    SIGNAL,
    SKIPPED,
    STOP,
    Lines,
    encode,
)

log = logging.getLogger("leaderd.supervisor")

KEEPER_DIED = "keeper died"  # the keeper ended without reporting: an internal failure
_ANSWER = 0.5  # how long a live keeper may take to report a tree leaderd has killed
_REKILL = 0.01  # how often leaderd kills the tree again until the keeper reports it gone


class Grip:
    """What leaderd itself can kill and check, whatever the keeper's state."""

    def __init__(self, keeper: int, mode: str, handle: str, cgroup: str = "") -> None:
        self.keeper, self.mode = keeper, mode
        self.cgroup = handle if mode == "cgroup" else cgroup
        self.init: int | None = None  # a pidfd on the init of the PID namespace
        if mode == "pidns":
            with contextlib.suppress(OSError):
                fd = os.pidfd_open(int(handle))
                # Still the keeper's child (pid not reused), or already adopted by leaderd.
                if _parent(int(handle)) in (keeper, os.getpid()):
                    self.init = fd
                else:
                    os.close(fd)

    def kill(self) -> None:
        """SIGKILL all of the tree at once (a PID namespace, a cgroup), else every process."""
        if self.init is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.init, signal.SIGKILL)
        if self.cgroup:
            cgroup_kill(self.cgroup)
        signal_tree(self.keeper, signal.SIGKILL)

    def gone(self) -> bool:
        """True once no process of the tree runs any more (zombies do not run)."""
        if self.init is not None and not select.select([self.init], [], [], 0)[0]:
            return False
        emptied = not self.cgroup or cgroup_empty(self.cgroup)
        return emptied and signal_tree(self.keeper, 0) == 0

    def close(self) -> None:
        if self.init is not None:
            os.close(self.init)
            self.init = None


def _above_stdio(fd: int) -> int:
    """A pipe at fd 0-2 (leaderd started with its stdio closed) would be the keeper's stdio,
    and so the command's: move it up."""
    if fd > 2:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


def _pipe(opened: list[int]) -> tuple[int, int]:
    """A pipe above stdio; its fds are in ``opened`` from the moment they exist."""
    ends = os.pipe()
    opened += ends
    moved = []
    for fd in ends:
        up = _above_stdio(fd)
        opened[opened.index(fd)] = up
        moved.append(up)
    return moved[0], moved[1]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


def _end(orphan: int, me: int) -> None:
    signal_tree(orphan, signal.SIGKILL)
    send(orphan, {me}, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(orphan, os.WNOHANG)  # a zombie is reaped now, a live one at a later turn


async def bury(grip: Grip) -> None:
    """Once the keeper is gone: kill what is left of its tree, and reap what leaderd adopted
    from it, until none of it runs."""
    me, since, said = os.getpid(), boottime(), False
    while True:
        grip.kill()
        orphans = children(me)
        for pid in orphans:
            _end(pid, me)
        if not orphans and grip.gone():
            grip.close()
            return
        if not said and boottime() - since > 5:
            said = True  # a process in uninterruptible sleep dies only when it wakes
            log.warning("still waiting for the processes of a dead keeper to end: %s", orphans)
        await asyncio.sleep(0.01)


# ---- leaderd's end of one keeper ----


class Child:
    """One keeper: its lifeline, its reports, its end, and leaderd's grip on its tree."""

    def __init__(
        self,
        keeper: subprocess.Popen[bytes],
        lifeline: int,
        report: int,
        term: int,
        deadline: float,
        cgroup: str = "",
    ) -> None:
        self.keeper, self.term, self.deadline = keeper, term, deadline
        self.pid = 0  # the command's pid, as the host sees it
        self.grip = Grip(keeper.pid, "session", "", cgroup)  # until the keeper says more
        self.skipped: list[tuple[str, str]] = []
        self.stopping = self.killed_keeper = self.killed_tree = self.running = False
        self.lost = ""  # how the keeper failed before COMMAND ran, if leaderd saw how
        self._lifeline, self._report, self._lines = lifeline, report, Lines()
        self.error: str | None = None
        self._exit: tuple[int, str] | None = None
        loop = asyncio.get_running_loop()
        self.reported: asyncio.Future[None] = loop.create_future()
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
        cls, command: list[str], env: dict[str, str], term: int, deadline: float, grace: float,
        contain: tuple[str, ...],
    ) -> Child:  # fmt: skip
        opened: list[int] = []  # closed again if anything below fails (EMFILE, ...)
        try:
            life_r, life_w = _pipe(opened)
            report_r, report_w = _pipe(opened)
            soft, hard = limits.ORIGINAL  # the daemon lifted its own for watchers, not COMMAND's
            args = keeper_argv(
                f"--lifeline={life_r}", f"--report={report_w}", f"--deadline={deadline!r}",
                f"--grace={grace!r}", f"--nofile={soft}:{hard}",
                *[f"--contain={spec}" for spec in contain], "--", *command,
            )  # fmt: skip
            # Its own session: off leaderd's terminal, so Ctrl-C reaches leaderd only.
            keeper = subprocess.Popen(
                args, env=env, pass_fds=(life_r, report_w), start_new_session=True
            )
            for fd in (life_r, report_w):  # the keeper's ends
                opened.remove(fd)
                os.close(fd)
            cgroup = next((spec[7:] for spec in contain if spec.startswith("cgroup=")), "")
            # Once it is ours, a failure closes the lifeline: the keeper then ends its tree.
            return cls(keeper, life_w, report_r, term, deadline, cgroup)
        except BaseException:
            for fd in opened:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise

    @property
    def name(self) -> str:
        """For the log: its pid once it runs (the host's), else its keeper's."""
        return f"pid {self.pid}" if self.running else f"of keeper pid {self.keeper.pid}"

    def extend(self, deadline: float) -> None:
        """Pass a later lease deadline on to the keeper's dead man's switch."""
        if deadline > self.deadline + 0.001 and not self.stopping:
            self.deadline = deadline
            self._tell(DEADLINE, repr(deadline))

    def stop(self) -> None:
        """Ask the keeper for SIGTERM to the tree now, SIGKILL at min(grace, deadline)."""
        self.stopping = True
        self._tell(STOP)

    def forward(self, signum: int) -> None:
        self._tell(SIGNAL, signum)

    async def finish(self, kill_in: float) -> None:
        """After stop(): the keeper ends the tree; if it has not within ``kill_in``, leaderd
        kills the tree itself, whatever the keeper's state, and then a keeper that still
        does not answer."""
        if kill_in > 0 and await self.gone(kill_in):
            return
        self.grip.kill()
        self.killed_tree = True
        if await self._killed_until_gone(_ANSWER):
            return
        log.warning(
            "the keeper of child %s did not answer; leaderd ended the child's tree itself",
            self.name,
            extra=extra(Event.KEEPER_UNRESPONSIVE, pid=self.pid),
        )
        self.kill_keeper()

    async def _killed_until_gone(self, timeout: float) -> bool:
        """Kill the tree again every _REKILL until the keeper reports it gone, or ``timeout``
        passes. A process whose parent died under one pass was adopted by the keeper (a
        subreaper) after that pass had read the keeper's children: the next pass finds it,
        even when the keeper is frozen."""
        give_up = boottime() + timeout
        while not await self.gone(min(_REKILL, max(0.0, give_up - boottime()))):
            if boottime() >= give_up:
                return False
            self.grip.kill()
        return True

    def kill_keeper(self) -> None:
        self.killed_keeper = True
        if self._pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def nap(self, wake: asyncio.Event, timeout: float) -> None:
        waiter: asyncio.Future[object] = asyncio.ensure_future(wake.wait())
        exited: asyncio.Future[object] = asyncio.ensure_future(asyncio.shield(self.exited))
        word: asyncio.Future[object] = asyncio.ensure_future(asyncio.shield(self.reported))
        await asyncio.wait([waiter, exited, word], timeout=timeout)
        for future in (waiter, exited, word):
            future.cancel()

    async def gone(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.exited), timeout)
        return self.exited.done()

    async def outcome(self) -> tuple[int, str]:
        """Once the keeper and the whole tree are gone: (the command's exit code, why it
        ended). The code is negative for a signal, as in subprocess."""
        await asyncio.shield(self.exited)
        self.keeper.wait()  # exited: its pidfd said so, this does not block
        for fd in (self._lifeline, self._pidfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._pidfd = -1  # never signal a number that may be reused
        if self._exit is not None:  # the keeper saw the tree gone before it reported
            self.grip.close()
            return self._exit
        await bury(self.grip)  # nothing the keeper held is known gone: make it so
        if self.killed_keeper:
            return -signal.SIGKILL, STOP
        return self.keeper.returncode, KEEPER_DIED

    def _tell(self, word: str, *args: object) -> None:
        with contextlib.suppress(OSError):  # a full pipe or a gone keeper: leaderd still kills
            os.write(self._lifeline, encode(word, *args))

    def _on_report(self) -> None:
        try:
            data = os.read(self._report, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        for word, rest in self._lines.feed(data):
            self._on_line(word, rest)
        if not data:
            if not self.reported.done():
                self.reported.set_result(None)
            self._closed(self._report)

    def _on_line(self, word: str, rest: str) -> None:
        first, _, second = rest.partition(" ")
        if word == CONTAINED:
            self.grip = Grip(self.keeper.pid, first, second, self.grip.cgroup)
        elif word == SKIPPED:
            self.skipped.append((first, second))
        elif word == PID:
            self.pid, self.running = int(first), True
        elif word == ERROR:
            self.error = rest
        elif word == EXIT:
            self._exit = int(first), second
        if word in (PID, ERROR) and not self.reported.done():
            self.reported.set_result(None)

    def _closed(self, fd: int) -> None:
        asyncio.get_running_loop().remove_reader(fd)
        if fd != self._pidfd:
            os.close(fd)  # the pidfd stays open until the keeper is reaped: it can be signalled
        self._open.discard(fd)
        if not self._open and not self.exited.done():
            self.exited.set_result(None)
