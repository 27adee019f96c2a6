"""A keeper started exactly as leaderd starts it (leaderd/supervision/keeper.py), with the
test as its leaderd: it writes the lifeline and reads the reports."""

from __future__ import annotations

import contextlib
import math
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from leaderd.clock import boottime
from leaderd.supervision.containment_probe import keeper_argv
from leaderd.supervision.keeper_protocol import DEADLINE, Lines, encode
from tests.support.daemons import wait_for

# A command that records its host pid and its workers', ignores SIGTERM if told to, and
# starts a worker that leaves its session (as daemonizing programs do) and ignores SIGTERM.
PROGRAM = """
import os, signal, sys, time
out = sys.argv[1]
def note(what):
    with open(out, "a") as f:
        f.write(f"{what} {os.readlink('/proc/self')}\\n")
signal.signal(signal.SIGHUP, lambda *_: note("hup"))
if "ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "worker" in sys.argv and os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    note("worker")
    while True:
        time.sleep(1)
note("command")
if "exit" in sys.argv:
    time.sleep(0.3)
    sys.exit(7)
while True:
    time.sleep(1)
"""


class Renewed(NamedTuple):
    """A running tree: the command's host pid, its workers', and the deadline said last."""

    command: int
    workers: list[int]
    deadline: float


class Keeper:
    """A keeper, with this test as its leaderd."""

    def __init__(self, workdir: str, *options: str, contain: str, deadline: float = math.inf,
                 grace: float = 1.0, wrap: tuple[str, ...] = (),
                 command: tuple[str, ...] = (), user: str = "",
                 told: tuple[tuple[str, str], ...] = ()) -> None:  # fmt: skip
        self.out = Path(workdir, "out")
        life_r, self.life = os.pipe()
        for word, rest in told:  # in the pipe before the keeper's interpreter is even up
            self.say(word, rest)
        self.report, report_w = os.pipe()
        python = _python_for(user) if user else sys.executable
        command = command or (python, "-c", PROGRAM, str(self.out), *options)
        args = keeper_argv(
            f"--lifeline={life_r}", f"--report={report_w}", f"--deadline={deadline!r}",
            f"--grace={grace}", f"--contain={contain}", "--", *command,
        )  # fmt: skip
        if user:  # the keeper and its command as this user, on an interpreter it may run
            args[0] = python
            wrap = ("setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups")
        self.proc = subprocess.Popen(
            [*wrap, *args], pass_fds=(life_r, report_w), start_new_session=True
        )
        os.close(life_r)
        os.close(report_w)
        self.lines = Lines()
        self.seen: list[tuple[str, str]] = []

    def say(self, word: str, *args: object) -> None:
        os.write(self.life, encode(word, *args))

    def wait_for(self, word: str, timeout: float = 10.0) -> str:
        """The rest of the first line ``word`` the keeper reported."""
        give_up = time.monotonic() + timeout
        while not self._said(word):
            left = give_up - time.monotonic()
            assert left > 0 and self._read(left), (word, self.seen)
        return next(rest for w, rest in self.seen if w == word)

    def _said(self, word: str) -> bool:
        return any(w == word for w, _ in self.seen)

    def _read(self, timeout: float) -> bool:
        """Read what the keeper reported within ``timeout``; False if it reported nothing."""
        if not select.select([self.report], [], [], timeout)[0]:
            return False
        data = os.read(self.report, 4096)
        assert data, f"the keeper ended: {self.seen}"
        self.seen += self.lines.feed(data)
        return True

    def pids(self, what: str) -> list[int]:
        text = self.out.read_text() if self.out.exists() else ""
        return [int(line.split()[1]) for line in text.splitlines() if line.startswith(what)]

    def running_renewed(self, ttl: float, worker: bool = True, ahead: float = 0.0) -> Renewed:
        """running(), renewing the deadline to ``ttl`` from now every 0.1 s as leaderd's
        rounds do, so that the tree runs with its deadline ``ttl`` away however long the
        start took (a deadline given once at the start raced it). The deadline said last
        comes with the pids. ``ahead``: how far the keeper's CLOCK_BOOTTIME runs ahead of
        ours (a time namespace)."""
        want = 1 if worker else 0
        give_up = time.monotonic() + 30
        while True:
            deadline = boottime() + ahead + ttl
            self.say(DEADLINE, repr(deadline))
            if self._said("pid") and self.pids("command") and len(self.pids("worker")) == want:
                break
            assert time.monotonic() < give_up, f"the tree did not start: {self.seen}"
            self._read(0.1)
        pid = int(next(rest for w, rest in self.seen if w == "pid"))
        assert self.pids("command") == [pid], "the keeper reports the host pid"
        return Renewed(pid, self.pids("worker"), deadline)

    def running(self, worker: bool = True) -> tuple[int, list[int]]:
        """(the command's host pid, its workers' host pids) once they all run."""
        pid = int(self.wait_for("pid"))
        want = 1 if worker else 0
        wait_for(lambda: self.pids("command") and len(self.pids("worker")) == want, 10)
        assert self.pids("command") == [pid], "the keeper reports the host pid"
        return pid, self.pids("worker")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.life)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        os.close(self.report)


def start(keepers: list[Keeper], workdir: str, *options: str, **kwargs: object) -> Keeper:
    keeper = Keeper(workdir, *options, **kwargs)  # type: ignore[arg-type]
    keepers.append(keeper)
    return keeper


def _python_for(user: str) -> str:
    """An interpreter (3.11 or later: the keeper needs nothing else) ``user`` can run."""
    for python in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable):
        check = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", python,
                 "-c", "import sys; assert sys.version_info >= (3, 11)"]  # fmt: skip
        if subprocess.run(check, capture_output=True, check=False).returncode == 0:
            return python
    pytest.skip(f"no Python 3.11 that user {user} may run")
