"""The supervised command of a chaos run (python -m tests.chaos.command BEATS).

It forks a worker that leaves its session and ignores SIGTERM, as a daemonizing program
does, and both append a heartbeat to the shared file BEATS every 20 ms until they are
killed: "beat NODE TERM INSTANCE MONOTONIC", INSTANCE naming this start of the command (the
worker beats under its command's). A command and all it started live from its first beat
to its last, so tests/support/chaos/check.py's check_commands() proves two alive at once.
"""

from __future__ import annotations

import os
import signal
import sys
import time

INTERVAL = 0.02


def beat_forever(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    while True:
        os.write(fd, f"beat {line} {time.monotonic():.6f}\n".encode())
        time.sleep(INTERVAL)


def main() -> None:
    path = sys.argv[1]
    instance = f"{os.readlink('/proc/self')}-{os.urandom(4).hex()}"  # host pid + a nonce
    line = f"{os.environ['LEADERD_NODE_ID']} {os.environ['LEADERD_TERM']} {instance}"
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    beat_forever(path, line)


if __name__ == "__main__":
    main()
