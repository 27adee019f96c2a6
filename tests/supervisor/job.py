"""The supervised program of the process tests: it records its life in a shared file.

Usage: job.py RECORD LOCK [--ignore-term] [--grandchildren] [--exit-after S CODE]

Each line of RECORD is "EVENT NODE TERM MONOTONIC PID". At start the job takes an
exclusive flock on LOCK without waiting: if another job still holds it, two jobs are alive
at once and the line "busy" is written before it waits. The kernel drops the flock the
instant a job dies, however it dies, so "busy" is the proof of an overlap.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time

_IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def main() -> None:
    record, lock = sys.argv[1], sys.argv[2]
    options = sys.argv[3:]
    node, term = os.environ["LEADERD_NODE_ID"], os.environ["LEADERD_TERM"]

    def write(event: str) -> None:
        line = f"{event} {node} {term} {time.monotonic():.6f} {os.getpid()}\n"
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
            write(f"grandchild-{'session' if own_session else 'group'}-{kid.pid}")
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


if __name__ == "__main__":
    main()
