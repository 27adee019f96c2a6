"""Each client example in examples/ runs against a live daemon, as its users would run it,
and each is also started before its daemon: it must follow the daemon within about a
second of the daemon's start, not after a whole long poll."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.daemons import REPO, Daemon, short_tempdir, wait_for

EXAMPLES = REPO / "examples"


# An example started before its daemon must follow it within its one-second retry, not
# after a long poll's 30 s: this bounds the wait from the daemon's readiness.
PROMPT = 5.0


@pytest.fixture
def unstarted() -> Iterator[Daemon]:
    """A daemon whose socket path is known but which does not run yet."""
    workdir = short_tempdir()
    d = Daemon("ex", f"sqlite://{workdir}/lease.db", workdir=workdir)
    yield d
    d.kill()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def daemon(unstarted: Daemon) -> Daemon:
    return start_leading(unstarted)


def start_leading(d: Daemon) -> Daemon:
    d.start().wait_ready()
    wait_for(d.is_leader, timeout=5, what="leadership")
    return d


@dataclass
class Late:
    """A daemon started after its client. The client's socket path appears only once the
    daemon leads, so the client's next poll finds it with no change to come: the case in
    which a client that forgot its revision waits out a whole long poll."""

    daemon: Daemon
    socket: str

    def start(self) -> Daemon:
        start_leading(self.daemon)
        os.symlink(self.daemon.socket, self.socket)
        return self.daemon


@pytest.fixture
def late(unstarted: Daemon) -> Late:
    return Late(unstarted, os.path.join(os.path.dirname(unstarted.socket), "app.sock"))


def env_for(d: Daemon, sock: str | None = None) -> dict[str, str]:
    # The examples call `leaderd` from PATH, as an installed package provides it.
    bindir = Path(os.path.dirname(d.socket)) / "bin"  # removed with the daemon's workdir
    bindir.mkdir(exist_ok=True)
    shim = bindir / "leaderd"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m leaderd "$@"\n')
    shim.chmod(0o755)
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "LEADERD_SOCKET": sock or d.socket,
    }


class Output:
    """A running example whose stdout lines we can wait for."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, text: str, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} in {self.seen}")

    def close(self) -> int:
        try:
            return self.proc.wait(15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def test_cron_job_runs_only_on_the_leader_with_its_term(daemon: Daemon, tmp_path: Path) -> None:
    env = env_for(daemon)
    out = tmp_path / "ran"
    job = [str(EXAMPLES / "shell" / "cron-job.sh"), "sh", "-c", f'echo "$LEADERD_TERM" > {out}']
    assert subprocess.run(job, env=env, check=False).returncode == 0
    term = daemon.get("/leader")[1]["term"]
    assert out.read_text().strip() == str(term)
    out.unlink()
    assert daemon.post("/resign?cooldown=30")[0] == 200
    assert subprocess.run(job, env=env, check=False).returncode == 0
    assert not out.exists(), "a follower must not run the job"


def test_shell_watch_loop_prints_each_change(daemon: Daemon) -> None:
    loop = Output(["sh", str(EXAMPLES / "shell" / "watch-loop.sh")], env_for(daemon))
    loop.expect(": leader, term")
    daemon.post("/resign?cooldown=30")
    loop.expect(": follower, term")
    time.sleep(0.3)  # let the next long poll reach the daemon before it goes away
    daemon.signal(signal.SIGTERM)
    loop.expect(": stopped")
    assert loop.close() == 0


def follow_leader(language: str, sock: str) -> list[str]:
    if language == "node":
        node = shutil.which("node")
        assert node, "Node.js is needed for the Node example (apt-get install nodejs)"
        return [node, str(EXAMPLES / "node" / "follow-leader.js"), sock]
    return [sys.executable, str(EXAMPLES / "python" / "follow_leader.py"), "--socket", sock]


@pytest.mark.parametrize("language", ["python", "node"])
def test_follow_leader_starts_and_stops_work(daemon: Daemon, language: str) -> None:
    app = Output(follow_leader(language, daemon.socket), env_for(daemon))
    term = daemon.get("/leader")[1]["term"]
    app.expect(f"became leader, term {term}: starting work")
    app.expect(f"working with fencing term {term}")
    daemon.post("/resign?cooldown=30")
    app.expect("no longer leader (follower): stopping work")
    time.sleep(0.3)  # let the next long poll reach the daemon before it goes away
    daemon.signal(signal.SIGTERM)
    app.expect("leaderd stopped")
    assert app.close() == 0


# --- each example started before the daemon ---------------------------------------------


def test_cron_job_before_the_daemon_does_nothing_then_runs(late: Late, tmp_path: Path) -> None:
    env = env_for(late.daemon, late.socket)
    out = tmp_path / "ran"
    job = [str(EXAMPLES / "shell" / "cron-job.sh"), "sh", "-c", f'echo "$LEADERD_TERM" > {out}']
    assert subprocess.run(job, env=env, check=False).returncode == 0
    assert not out.exists(), "no daemon: the job must not run"
    daemon = late.start()
    assert subprocess.run(job, env=env, check=False).returncode == 0
    assert out.read_text().strip() == str(daemon.get("/leader")[1]["term"])


def client(kind: str, sock: str) -> tuple[list[str], str, str]:
    """A following example: its command, its line once leading ({term}), its line on stop."""
    if kind == "shell":
        return (
            ["sh", str(EXAMPLES / "shell" / "watch-loop.sh")],
            ": leader, term {term}",
            ": stopped",
        )
    return follow_leader(kind, sock), "became leader, term {term}: starting work", "leaderd stopped"


@pytest.mark.parametrize("kind", ["shell", "python", "node"])
def test_example_started_first_follows_the_daemon(late: Late, kind: str) -> None:
    args, leading, stopped = client(kind, late.socket)
    app = Output(args, env_for(late.daemon, late.socket))
    if kind == "shell":
        time.sleep(1.5)  # it prints nothing until it reaches a daemon: let it fail once
    else:
        app.expect("leaderd unreachable")
    daemon = late.start()
    term = daemon.get("/leader")[1]["term"]
    app.expect(leading.format(term=term), timeout=PROMPT)
    time.sleep(0.3)  # let the next long poll reach the daemon before it goes away
    daemon.signal(signal.SIGTERM)
    app.expect(stopped)
    assert app.close() == 0
