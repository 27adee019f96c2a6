"""The last guard of COMMAND's tree: PID 1 of its PID namespace, or without one, its parent
and a child subreaper (docs/run.md, "Who ends the tree when something fails").

A fork of the keeper (standard library only, like it). It starts COMMAND, reaps every orphan,
passes signals on, and tells the keeper COMMAND's pid and exit code. It also holds the lease
deadline, which only the keeper's ``deadline T`` lines (leaderd's renewals) move later, and
enforces it by itself: if leaderd and the keeper are frozen together, it SIGTERMs the whole
tree after both had their turn, and SIGKILLs it just before the deadline, so nothing of it is
left when the deadline comes. The timer is a timerfd on CLOCK_BOOTTIME, like the keeper's.
The keeper's death (EOF on the orders pipe, or ``PR_SET_PDEATHSIG``) ends the guard at once;
in a PID namespace the kernel ends the namespace with it, elsewhere COMMAND dies with it
(``PR_SET_PDEATHSIG``) and its other descendants become the keeper's, or leaderd's.

In a namespace, PID 1 ignores the signals it has no handler for, so COMMAND can neither kill
nor stop it; from outside, SIGKILL can. Without a namespace COMMAND can kill its guard.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
from typing import NoReturn

from .containment import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_PDEATHSIG,
    Session,
    Timer,
    boottime,
    children,
    prctl,
    why_not,
)
from .keeper_protocol import DEADLINE, ERROR, EXIT, EXITED, GUARDED, PID, Lines, encode

_AGAIN = 0.1  # how often SIGKILL is sent again, for whatever was forked meanwhile


def term_at(deadline: float, grace: float) -> float:
    """When the guard SIGTERMs the tree: after leaderd (at ``deadline - grace``) and the
    keeper (a quarter of the grace later, at most 0.25 s) had their turn."""
    return deadline - grace + min(0.5, grace / 2)


def kill_at(deadline: float, grace: float) -> float:
    """When the guard SIGKILLs the tree: a little before the deadline, so that its end is
    complete (the namespace empty) when the deadline comes."""
    return deadline - min(0.05, grace / 10)


class Guard:
    """One tree's guard: COMMAND's pid, the deadline, and the line pipes to the keeper."""

    def __init__(self, tree: Session, out: int, orders: int, grace: float) -> None:
        self.tree, self.out, self.orders = tree, out, orders
        self.deadline, self.grace = tree.deadline, grace
        self.command = 0  # COMMAND's pid in the namespace, until it is reaped
        self.proc: subprocess.Popen[bytes] | None = None
        self.why = EXITED  # GUARDED once the guard itself began to end the tree
        self.terminated, self.killed = False, 0.0
        self.me = os.getpid()
        self.lines = Lines()
        self.timer = Timer()
        self.wake, wake_w = os.pipe()
        for fd in (self.wake, wake_w, orders):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w)

    def start(self, argv: list[str], env: dict[str, str]) -> None:
        try:
            self.proc = subprocess.Popen(
                argv, env=env, process_group=0, preexec_fn=self._in_command
            )
        except (OSError, subprocess.SubprocessError) as exc:
            os.write(self.out, encode(ERROR, why_not(exc)))
            os._exit(127)
        self.command = self.proc.pid
        me = int(os.readlink("/proc/self"))  # /proc is the host's: the host pids
        os.write(self.out, encode(PID, next(iter(children(me)), 0)))

    def _in_command(self) -> None:  # safe: the guard is single-threaded
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with its guard, even SIGKILLed
        if os.getppid() != self.me:
            os._exit(1)
        self.tree.join()

    def run(self) -> NoReturn:
        while True:
            self.take_orders()
            self.reap()
            now = boottime()
            self.enforce(now)
            due = self.killed + _AGAIN if self.killed else self.next_due()
            self.timer.arm(due)
            fds = [self.orders, self.wake, self.timer.fd]
            for fd in select.select(fds, [], [], min(1.0, max(0.0, due - now)))[0]:
                if fd != self.orders:
                    with contextlib.suppress(BlockingIOError):
                        os.read(fd, 4096)

    def take_orders(self) -> None:
        """Read the keeper's lines: a later deadline moves the guard's; EOF, the keeper died."""
        while True:
            try:
                data = os.read(self.orders, 4096)
            except BlockingIOError:
                return
            if not data:
                os._exit(1)  # the kernel now ends the namespace
            for word, rest in self.lines.feed(data):
                if word == DEADLINE and not self.terminated:
                    self.deadline = max(self.deadline, float(rest))

    def reap(self) -> None:
        """Reap every child; report COMMAND's end; exit once nothing is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(0)
            if pid == 0:
                return
            if pid == self.command:
                self.command = 0
                code = os.waitstatus_to_exitcode(status)
                os.write(self.out, encode(EXIT, code, self.why))

    def enforce(self, now: float) -> None:
        """The deadline came and nobody moved it: end the tree, whatever else is frozen."""
        if now >= kill_at(self.deadline, self.grace):
            self.why, self.terminated, self.killed = GUARDED, True, now
            self.tree.everyone(signal.SIGKILL)
        elif now >= term_at(self.deadline, self.grace) and not self.terminated:
            self.why, self.terminated = GUARDED, True
            self.tree.everyone(signal.SIGTERM)

    def next_due(self) -> float:
        return (
            kill_at(self.deadline, self.grace)
            if self.terminated
            else term_at(self.deadline, self.grace)
        )

    def forward(self, signum: int) -> None:
        with contextlib.suppress(OSError):
            if self.command:
                os.kill(self.command, signum)


def init(
    tree: Session, argv: list[str], env: dict[str, str], out: int, orders: int, *, grace: float
) -> NoReturn:
    """The guard of ``tree`` (in a PID namespace, its PID 1): ``out`` reports to the keeper,
    ``orders`` carries the keeper's deadlines, the first of them is ``tree.deadline``."""
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the tree become the guard's
        signal.set_wakeup_fd(-1)
        guard = Guard(tree, out, orders, grace)
        guard.take_orders()  # the keeper died before prctl: its EOF is already there
        signal.signal(signal.SIGCHLD, _nothing)  # a handler, so that SIGCHLD wakes select
        signal.signal(signal.SIGINT, _nothing)  # a handler, not SIG_IGN: exec resets it
        signal.signal(signal.SIGTERM, lambda _signum, _frame: tree.everyone(signal.SIGTERM))
        for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, lambda signum, _frame: guard.forward(signum))
        guard.start(argv, env)
        guard.run()
    finally:
        os._exit(127)


def _nothing(_signum: int, _frame: object) -> None:
    """A handler that only wakes the loop (through the wakeup fd)."""
