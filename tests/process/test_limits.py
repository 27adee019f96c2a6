"""The open-file limit: lifted for watchers, given back to the supervised command."""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemons import Daemon, short_tempdir, wait_for


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def soft_nofile(limits: str) -> int:
    for line in limits.splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-file limit")


def test_daemon_lifts_its_limit_and_the_child_gets_the_original(workdir: str) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    low = min(1024, hard // 2)
    assert low < hard, "the test needs a hard limit above its soft one"
    # The child reads its own limits: its pid may be one of a PID namespace, not the host's.
    out = Path(workdir, "child.limits")
    d = Daemon(
        "lim",
        f"sqlite://{workdir}/lease.db",
        workdir=workdir,
        command=["sh", "-c", f"cat /proc/self/limits > {out}.new; mv {out}.new {out}; sleep 60"],
    )
    d.args = ["prlimit", f"--nofile={low}:{hard}", *d.args]
    d.start().wait_ready()
    child = wait_for(lambda: out.exists() and out.read_text(), 10)
    assert soft_nofile(Path(f"/proc/{d.pid}/limits").read_text()) == hard
    assert soft_nofile(child) == low
    assert d.stop() == 0


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def restarting(workdir: str, node_id: str, *wrapper: str) -> tuple[Daemon, Path]:
    """A ready daemon whose short child is restarted; each start adds a line to the file."""
    starts = Path(workdir) / "starts"
    d = Daemon(
        node_id,
        "static://",
        workdir=workdir,
        extra_args=["--on-exit", "restart"],
        command=["sh", "-c", f"echo started >> {starts}; sleep 0.2"],
    )
    d.args = [*wrapper, *d.args]
    d.start().wait_ready()
    wait_for(lambda: starts.exists(), 10, what="the first child")
    return d, starts


def test_out_of_files_does_not_end_a_restarting_daemon(workdir: str) -> None:
    """`run --on-exit restart` whose child cannot be started for want of file descriptors
    exited 1 with a traceback; it must keep its lease and start the child again later."""
    d, starts = restarting(workdir, "emfile")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    # No new file descriptor for the daemon: the next start fails with EMFILE.
    subprocess.run(["prlimit", f"--pid={d.pid}", f"--nofile={open_files(d.pid)}:{hard}"],
                   check=True)  # fmt: skip
    wait_for(lambda: "cannot start the child" in d.log(), 10, what="the failed start")
    count = len(starts.read_text().splitlines())
    time.sleep(1.5)
    assert d.alive(), d.log()
    assert d.is_leader() is not False
    subprocess.run(["prlimit", f"--pid={d.pid}", f"--nofile={hard}:{hard}"], check=True)
    wait_for(lambda: len(starts.read_text().splitlines()) > count, 15, what="a new child")
    assert d.stop() == 0
    assert "Traceback" not in d.log()
    assert "Too many open files; trying again in 1s" in d.log()


def test_clients_cannot_take_the_files_the_child_needs(workdir: str) -> None:
    """300 clients hold connections to a daemon limited to 256 files: those over its
    budget get 503, and the child still restarts (it needs files for its pipes)."""
    d, starts = restarting(workdir, "hog", "prlimit", "--nofile=256:256")
    socks = []
    for _ in range(300):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(d.socket)
        sock.sendall(b"GET /watch?timeout=60 HTTP/1.1\r\nHost: x\r\n\r\n")
        socks.append(sock)
    count = len(starts.read_text().splitlines())
    time.sleep(1.5)
    held, refused = [], 0
    for sock in socks:
        sock.setblocking(False)
        try:
            refused += sock.recv(100).startswith(b"HTTP/1.1 503")
            sock.close()
        except BlockingIOError:
            held.append(sock)  # waiting on its long poll
    assert len(held) <= 128 and refused == 300 - len(held), (len(held), refused)
    # The child restarts with a growing back-off (1, 2, 4, 8... s): one more start.
    wait_for(lambda: len(starts.read_text().splitlines()) > count, 40, what="a restart")
    for sock in held:
        sock.close()
    assert d.stop() == 0
    assert "Traceback" not in d.log() and "cannot start the child" not in d.log()
