"""The supervised program of the process tests: it records its life in a shared file.

Usage: job.py RECORD LOCK [--ignore-term] [--grandchildren] [--setsid-worker]
              [--fork-worker] [--exit-after S CODE]

Each line of RECORD is "EVENT NODE TERM MONOTONIC PID", PID as the host sees it (in a PID
namespace getpid() says another number). At start the job takes an exclusive flock on LOCK
without waiting: if another job still holds it, two jobs are alive at once and the line
"busy" is written before it waits. The kernel drops the flock the instant the last process
holding it dies, however it dies, so "busy" is the proof of an overlap.

A worker (--setsid-worker: in a session of its own, as a daemonizing program does;
--fork-worker: a plain fork) is a forked copy that shares the job's flock, ignores SIGTERM
and ticks ("wtick") until it is killed: while any worker lives, the job's lock is held.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import NoReturn

_IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def main() -> None:
    record, lock = sys.argv[1], sys.argv[2]
    options = sys.argv[3:]
    node, term = os.environ["LEADERD_NODE_ID"], os.environ["LEADERD_TERM"]

    def write(event: str) -> None:
        line = f"{event} {node} {term} {time.monotonic():.6f} {host_pid()}\n"
        fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, line.encode())
        os.close(fd)

    held = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        write("busy")
        fcntl.flock(held, fcntl.LOCK_EX)
    write("start")

    def on_term(_signum: int, _frame: object) -> None:
        write("stop")
        sys.exit(0)

    signal.signal(signal.SIGTERM, signal.SIG_IGN if "--ignore-term" in options else on_term)
    signal.signal(signal.SIGHUP, lambda _s, _f: write("hup"))
    if "--grandchildren" in options:
        # One in our process group, one that leaves it (as a daemonizing program would).
        for own_session in (False, True):
            argv = [sys.executable, "-c", _IGNORE_TERM, record]  # record: for the teardown
            kid = subprocess.Popen(argv, start_new_session=own_session)
            write(f"grandchild-{'session' if own_session else 'group'}-{host_pid_of(kid.pid)}")
    job = host_pid()
    for kind in ("setsid", "fork"):
        if f"--{kind}-worker" in options and os.fork() == 0:
            work(f"worker-{kind}-{job}", write)
    exit_at = None
    if "--exit-after" in options:
        at = options.index("--exit-after")
        exit_at = time.monotonic() + float(options[at + 1])
        code = int(options[at + 2])
    while True:
        write("tick")
        if exit_at is not None and time.monotonic() >= exit_at:
            write("exit")
            sys.exit(code)
        time.sleep(0.1)


def work(name: str, write: Callable[[str], None]) -> NoReturn:
    """A worker: it outlives the job unless something kills it."""
    if "setsid" in name:
        os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    write(name)
    while True:
        write("wtick")
        time.sleep(0.1)


def host_pid() -> int:
    return int(os.readlink("/proc/self"))  # /proc is the host's: its "self" is the host pid


def host_pid_of(child: int) -> int:
    """A child's host pid, from its pid here (NSpid lists it in every namespace, host first)."""
    me = host_pid()
    with open(f"/proc/{me}/task/{me}/children") as f:
        for pid in f.read().split():
            with open(f"/proc/{pid}/status") as status:
                nspid = next(line for line in status if line.startswith("NSpid:")).split()
            if int(nspid[-1]) == child:
                return int(pid)
    raise LookupError(child)


if __name__ == "__main__":
    main()
