"""Each client example in examples/ runs against a live daemon, as its users would run it."""

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
from pathlib import Path

import pytest

from tests.daemons import REPO, Daemon, short_tempdir, wait_for

EXAMPLES = REPO / "examples"


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    workdir = short_tempdir()
    d = Daemon("ex", f"sqlite://{workdir}/lease.db", workdir=workdir).start()
    d.wait_ready()
    wait_for(d.is_leader, timeout=5, what="leadership")
    yield d
    d.kill()
    shutil.rmtree(workdir, ignore_errors=True)


def env_for(d: Daemon) -> dict[str, str]:
    # The examples call `leaderd` from PATH, as an installed package provides it.
    bindir = Path(short_tempdir("ld-bin-"))
    shim = bindir / "leaderd"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m leaderd "$@"\n')
    shim.chmod(0o755)
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "LEADERD_SOCKET": d.socket,
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


@pytest.mark.parametrize("language", ["python", "node"])
def test_follow_leader_starts_and_stops_work(daemon: Daemon, language: str) -> None:
    if language == "node":
        node = shutil.which("node")
        assert node, "Node.js is needed for the Node example (apt-get install nodejs)"
        args = [node, str(EXAMPLES / "node" / "follow-leader.js"), daemon.socket]
    else:
        script = EXAMPLES / "python" / "follow_leader.py"
        args = [sys.executable, str(script), "--socket", daemon.socket]
    app = Output(args, env_for(daemon))
    term = daemon.get("/leader")[1]["term"]
    app.expect(f"became leader, term {term}: starting work")
    app.expect(f"working with fencing term {term}")
    daemon.post("/resign?cooldown=30")
    app.expect("no longer leader (follower): stopping work")
    time.sleep(0.3)  # let the next long poll reach the daemon before it goes away
    daemon.signal(signal.SIGTERM)
    app.expect("leaderd stopped")
    assert app.close() == 0
