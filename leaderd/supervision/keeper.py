"""The keeper: the one process between leaderd and COMMAND (docs/run.md, "Containment").

leaderd runs it as a fresh ``python -I -S`` (standard library only, nothing taken from the
command's environment, up in milliseconds). leaderd holds the write end of the *lifeline*
and the read end of the *report* pipe; the lines defined below are all the two ever say.

The keeper starts COMMAND in the best containment the host allows (containment.py),
stops its whole tree when leaderd says so, by itself at the lease deadline if leaderd is
frozen (a dead man's switch on CLOCK_BOOTTIME, which counts suspend), and at once if leaderd
dies (the lifeline reads EOF). It passes every deadline on to the guard of the tree
(guard.py), which holds one too, for when the keeper is frozen as well. It reports
the end, and exits, only once the tree is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import resource
import select
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import NoReturn

from . import guard
from .containment import (
    PR_SET_CHILD_SUBREAPER,
    Pidns,
    Session,
    Timer,
    boottime,
    choose,
    prctl,
    why_not,
)
from .keeper_protocol import (
    CONTAINED,
    DEADLINE,
    DEADLINE_PASSED,
    ERROR,
    EXIT,
    EXITED,
    GUARDED,
    LOST,
    ORPHANED,
    SIGNAL,
    SKIPPED,
    STOP,
    STOPPED,
    Lines,
    encode,
)

# ---- the keeper ----


def switch_at(deadline: float, grace: float) -> float:
    """When the keeper's dead man's switch SIGTERMs the tree: just after leaderd's turn (at
    ``deadline - grace``), before the guard's (guard.py)."""
    return deadline - grace + min(0.25, grace / 4)


class Keeper:
    """One command's life: start it, keep the dead man's switch, stop it, report its end."""

    def __init__(self, args: argparse.Namespace, tree: Session) -> None:
        self.tree = tree
        self.life, self.report = args.lifeline, args.report
        self.deadline, self.grace = args.deadline, args.grace
        self.status: int | None = None  # COMMAND's exit code, once known
        self.child_code = 0  # the keeper's child's, once reaped
        self.why, self.stopping, self.orphaned, self.childless = EXITED, False, False, False
        self.kill_at = math.inf
        self.lifeline, self.messages = Lines(), Lines()
        self.timer = Timer()
        self.wake, wake_w = os.pipe()
        for fd in (self.wake, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w)
        self.private = (self.life, self.report, self.wake, wake_w, self.timer.fd)
        tree.extend(self.deadline)

    def tell(self, word: str, *args: object) -> None:
        with contextlib.suppress(OSError):  # leaderd gone: nobody listens, the work goes on
            os.write(self.report, encode(word, *args))

    def run(self, command: list[str]) -> NoReturn:
        try:
            self.tree.start(command, dict(os.environ), self.private)
        except (OSError, subprocess.SubprocessError) as exc:
            self.tell(ERROR, why_not(exc))
            self.tell(EXIT, 127, EXITED)  # nothing was started: nothing is left
            os._exit(127)
        self.tell(CONTAINED, self.tree.mode, self.tree.handle())
        while not self.finished():
            self.turn()
        code = self.child_code if self.status is None else self.status
        self.tell(EXIT, code, self.why)
        os._exit(code if code >= 0 else 128 - code)

    def finished(self) -> bool:
        # What leaderd already said (a deadline, "stop") counts before any death or the
        # switch is judged: an init leaderd killed after saying stop is no loss.
        self.take_input(0.0)
        self.reap()
        return self.childless and self.tree.empty()

    def turn(self) -> None:
        self.tree.flush()
        now = boottime()
        switch = switch_at(self.deadline, self.grace)
        if not self.stopping and self.status is not None:
            self.stop(EXITED, min(now + self.grace, self.deadline))  # what is left of it
        elif not self.stopping and now >= switch:
            self.stop(DEADLINE_PASSED, min(now + self.grace, self.deadline))
        if now >= self.kill_at:
            self.tree.kill()
            self.kill_at = now + 0.1  # again, for whatever was forked meanwhile
        due = self.kill_at if self.stopping else switch
        self.timer.arm(due)
        self.take_input(min(1.0, max(0.0, due - now)))

    def take_input(self, timeout: float) -> None:
        """Wait up to ``timeout`` for leaderd, the guard, a signal or the timer; handle it."""
        fds = [self.wake, self.timer.fd, *([] if self.orphaned else [self.life])]
        fds += [] if self.tree.messages is None else [self.tree.messages]
        for fd in select.select(fds, [], [], timeout)[0]:
            if fd == self.life:
                self.on_lifeline()
            elif fd == self.tree.messages:
                self.on_messages()
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(fd, 4096)

    def stop(self, why: str, kill_at: float) -> None:
        self.stopping, self.why, self.kill_at = True, why, kill_at
        self.tree.terminate()

    def on_lifeline(self) -> None:
        data = os.read(self.life, 4096)
        if not data:  # leaderd is gone: nobody supervises this command any more
            self.orphaned = True
            if not self.stopping:
                self.stop(ORPHANED, boottime())
            self.kill_at = boottime()
        for word, rest in self.lifeline.feed(data):
            if word == DEADLINE and not self.stopping:
                self.deadline = float(rest)
                self.tree.extend(self.deadline)
            elif word == STOP and not self.stopping:
                self.stop(STOPPED, min(boottime() + self.grace, self.deadline))
            elif word == SIGNAL:
                self.tree.forward(int(rest))

    def on_messages(self) -> None:
        """What the guard says: COMMAND's pid, start error or exit code."""
        assert self.tree.messages is not None
        data = os.read(self.tree.messages, 4096)
        if not data:
            os.close(self.tree.messages)
            self.tree.messages = None
        for word, rest in self.messages.feed(data):
            if word == EXIT:
                code, _, why = rest.partition(" ")
                self.status = int(code)
                if why == GUARDED and not self.stopping:  # the guard ended it by itself
                    self.stop(GUARDED, self.deadline)
                continue
            if word == ERROR:
                self.status = 127  # as a shell says "command not found"
            self.tell(word, rest)

    def reap(self) -> None:
        while not self.childless:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.childless = True
                break
            if pid == 0:
                break
            if pid == self.tree.child:
                self.tree.reaped, self.child_code = True, os.waitstatus_to_exitcode(wait_status)
                self.on_child_end()

    def on_child_end(self) -> None:
        if self.tree.messages is not None:  # the guard's last words come before its end
            self.on_messages()
        if self.status is None and not self.stopping:  # the guard died, nobody here ended it
            self.stop(LOST, boottime())  # what it held is the keeper's now: end it at once


def _nothing(_signum: int, _frame: object) -> None:
    """A handler that only wakes the loop (through the wakeup fd)."""


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="keeper", description="Runs COMMAND for leaderd.")
    p.add_argument("--lifeline", type=int, default=-1, help="fd: leaderd's lines, EOF at its end")
    p.add_argument("--report", type=int, default=1, help="fd: the keeper's lines")
    p.add_argument("--deadline", type=float, default=math.inf, help="CLOCK_BOOTTIME seconds")
    p.add_argument("--grace", type=float, default=5.0, help="seconds from SIGTERM to SIGKILL")
    p.add_argument("--nofile", default="", help="SOFT:HARD open-file limit for COMMAND")
    p.add_argument("--contain", action="append", default=[], help="pidns, cgroup=PATH, session")
    p.add_argument("--probe", action="store_true", help="only report the containment, then exit")
    p.add_argument("command", nargs="*")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    for fd in (0, 1, 2):  # else the keeper's first fds would be the command's stdio
        try:
            os.fstat(fd)
        except OSError:
            os.set_inheritable(os.open(os.devnull, os.O_RDWR), True)  # the lowest free: fd
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.nofile:  # leaderd lifted its own for its watchers: COMMAND gets the original
        soft, hard = map(int, args.nofile.split(":"))
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphaned descendants become the keeper's children
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _nothing)  # leaderd says when to stop, on the lifeline
    tree, skipped = choose(
        args.contain or ["session"], functools.partial(guard.init, grace=args.grace)
    )
    keeper = Keeper(args, tree)
    for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, lambda signum, _frame: tree.forward(signum))
    for mode, why in skipped:
        keeper.tell(SKIPPED, mode, why)
    if args.probe:
        _probe(keeper, tree)
    keeper.run(args.command)


def _probe(keeper: Keeper, tree: Session) -> NoReturn:
    """Report the containment this host allows; a PID namespace must also take a process."""
    if isinstance(tree, Pidns):
        try:
            pid = os.fork()
        except OSError as exc:
            keeper.tell(SKIPPED, tree.mode, why_not(exc))
            keeper.tell(CONTAINED, Session.mode)
            os._exit(0)
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    keeper.tell(CONTAINED, tree.mode)
    os._exit(0)


if __name__ == "__main__":
    main()
