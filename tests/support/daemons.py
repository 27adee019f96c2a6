"""Real leaderd processes for process tests, benchmarks and the chaos harness.

Each Daemon is `python -m leaderd run ...` in its own session, with its log in a
file, queried over its Unix socket. The tests' polls ask in process (`ask`): a `curl` run
per poll cost about 12 ms of CPU, and the process tests poll tens of times a second, so curl
took a third of their CPU. The tests that show a user's own commands run curl itself
(`curl`): the CLI, the container image, the socket's permissions.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from leaderd.api.client import UnixConnection

REPO = Path(__file__).resolve().parents[2]


def short_tempdir(prefix: str = "ld-") -> str:
    """A directory for sockets: Unix socket paths must stay under 108 bytes."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


class Daemon:
    # Every daemon started, so that a failed test leaves none running (tests/conftest.py).
    started: ClassVar[list[Daemon]] = []

    def __init__(
        self,
        node_id: str,
        backend: str,
        *,
        workdir: str,
        elections: Sequence[str] = ("default",),
        ttl: float = 2.0,
        renew_interval: float = 0.5,
        retry_interval: float = 0.25,
        extra_args: Sequence[str] = (),
        command: Sequence[str] = (),
        env: dict[str, str] | None = None,
        socket: str | None = None,
    ) -> None:
        self.node_id = node_id
        self.backend = backend
        self.socket = socket or os.path.join(workdir, f"{node_id}.sock")
        self.log_path = os.path.join(workdir, f"{node_id}.log")
        self.args = [
            sys.executable, "-m", "leaderd", "run",
            "--backend", backend, "--node-id", node_id, "--socket", self.socket,
            "--ttl", str(ttl), "--renew-interval", str(renew_interval),
            "--retry-interval", str(retry_interval), "--log-level", "debug",
            *[arg for name in elections for arg in ("--election", name)],
            *extra_args,
        ]  # fmt: skip
        if command:
            self.args += ["--", *command]
        # A static:// daemon keeps its terms in the state directory: the test's own.
        own = {"PYTHONPATH": str(REPO), "STATE_DIRECTORY": workdir}
        self.env = {**os.environ, **own, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Daemon:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it open
        self.proc = subprocess.Popen(
            self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()
        Daemon.started.append(self)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 15.0) -> int:
        if not self.alive():
            return self.proc.returncode if self.proc else 0
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.alive():
            os.killpg(self.pid, signal.SIGKILL)
            self.wait()

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, Any]:
        """GET over the Unix socket: (status code, JSON body); (0, None) if nobody answers."""
        return ask(self.socket, path, timeout=timeout)

    def post(self, path: str, timeout: float = 5.0) -> tuple[int, Any]:
        return ask(self.socket, path, method="POST", timeout=timeout)

    def is_leader(self) -> bool | None:
        """True/False from /leader; None when the daemon does not answer."""
        code, _ = self.get("/leader")
        return None if code == 0 else code == 200

    def wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise AssertionError(f"{self.node_id} exited early:\n{self.log()}")
            if self.get("/ready")[0] == 200:
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.node_id} not ready after {timeout}s:\n{self.log()}")


def ask_text(
    socket_path: str, path: str, *, method: str = "GET", timeout: float = 5.0
) -> tuple[int, str]:
    """(status code, body) asked in process; (0, "") if nobody answers in ``timeout``."""
    connection = UnixConnection(socket_path, timeout)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return 0, ""
    finally:
        connection.close()


def ask(
    socket_path: str, path: str, *, method: str = "GET", timeout: float = 5.0
) -> tuple[int, Any]:
    """(status code, JSON body) asked in process; (0, None) if nobody answers."""
    code, body = ask_text(socket_path, path, method=method, timeout=timeout)
    return code, json.loads(body) if body.strip() else None


def curl(
    socket_path: str, path: str, *, method: str = "GET", timeout: float = 5.0
) -> tuple[int, Any]:
    """(status code, JSON body) from `curl --unix-socket`; (0, None) if nobody answers."""
    assert shutil.which("curl"), "curl is needed by the process tests (apt-get install curl)"
    out = subprocess.run(
        ["curl", "-sS", "-X", method, "--max-time", str(timeout), "--unix-socket", socket_path,
         "-w", "\n%{http_code}", f"http://localhost{path}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    body, _, code = out.stdout.rpartition("\n")
    if out.returncode != 0 or not code.isdigit() or code == "000":
        return 0, None
    return int(code), json.loads(body) if body.strip() else None


def wait_for(
    predicate: Any, timeout: float, interval: float = 0.02, what: str = "condition"
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def metric(daemon: Daemon, name: str) -> float:
    """The sum of the samples whose line starts with ``name`` on the daemon's /metrics."""
    code, out = ask_text(daemon.socket, "/metrics")
    assert code == 200, f"/metrics answered {code}"
    values = [float(line.split()[-1]) for line in out.splitlines() if line.startswith(name)]
    return sum(values)


def leaders(daemons: Sequence[Daemon]) -> list[Daemon]:
    return [d for d in daemons if d.alive() and d.is_leader()]


def history(d: Daemon, limit: int) -> list[tuple[int, str, str | None]]:
    """(term, holder, end reason) of the newest ``limit`` records of d's /history."""
    records = d.get(f"/history?limit={limit}")[1]["records"]
    return [(r["term"], r["holder"], r["end_reason"]) for r in records]


def end_of(d: Daemon, term: int, timeout: float = 10.0) -> tuple[int, str, str | None]:
    """``term``'s record in d's /history once it tells how the term ended. The engine reads
    the history again after the holder changes: an answer at that moment may predate it."""
    found = wait_for(lambda: [r for r in history(d, 3) if r[0] == term and r[2]], timeout,
                     what=f"the end of term {term} in {d.node_id}'s history")  # fmt: skip
    return found[0]  # type: ignore[no-any-return]


def released_to(new: Daemon, leader: Daemon, term: int, timeout: float) -> None:
    """A hand-over at once: ``leader``'s ``term`` ended with its release and ``new`` holds
    the next one. Had the release failed, the term would have ended "expired" (or "taken
    over"), a ttl later."""
    told = [(term + 1, new.node_id, None), (term, leader.node_id, "released")]
    wait_for(lambda: history(new, 2) == told, timeout=timeout, what="the release in the history")


def only_leader_for(leader: Daemon, others: Sequence[Daemon], seconds: float = 1.0) -> None:
    """For ``seconds``, ``leader`` alone answers "leader" (polled every 50 ms)."""
    for _ in range(max(1, round(seconds / 0.05))):
        assert leaders([leader, *others]) == [leader]
        time.sleep(0.05)


def leaderd_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """`leaderd ARGS...` as a user runs it (this checkout's code); its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "leaderd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        check=False,
    )


def frozen_outside_a_write(daemon: Daemon) -> None:
    """SIGSTOP ``daemon`` at a moment it holds no write lock on its SQLite file: frozen in
    the middle of its own write (a heartbeat), it would hold off every other writer, the
    leader's renewals too, until SIGCONT (docs/sqlite.md: a held lock fails closed)."""
    for _ in range(200):
        daemon.signal(signal.SIGSTOP)
        if not writing(daemon):
            return
        daemon.signal(signal.SIGCONT)
        time.sleep(0.005)
    raise AssertionError(f"{daemon.node_id} was inside a SQLite write at every try")


def writing(daemon: Daemon) -> bool:
    """Whether ``daemon`` holds an exclusive lock on its SQLite file or the file's -shm (WAL
    writers hold one there), read from /proc/locks; False for other backends."""
    if not daemon.backend.startswith("sqlite:"):
        return False
    path = daemon.backend.removeprefix("sqlite://").split("?")[0]
    inodes = {os.stat(name).st_ino for name in (path, path + "-shm") if os.path.exists(name)}
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()  # 1: POSIX ADVISORY WRITE <pid> <maj:min:inode> <start> <end>
            held = len(fields) >= 6 and fields[3] == "WRITE" and fields[4] == str(daemon.pid)
            if held and int(fields[5].rsplit(":", 1)[1]) in inodes:
                return True
    return False
