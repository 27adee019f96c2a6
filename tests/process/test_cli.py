"""The command line as operators use it: watch, JSON logs, socket activation, the quick start."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

import orjson
import pytest

from tests.support.daemons import REPO, Daemon, curl, short_tempdir, wait_for


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_watch_prints_one_line_per_change(workdir: str) -> None:
    d = Daemon("w", f"sqlite://{workdir}/lease.db", workdir=workdir).start()
    d.wait_ready()
    wait_for(d.is_leader, timeout=5, what="leadership")
    watch = subprocess.Popen(
        [sys.executable, "-m", "leaderd", "watch", "--socket", d.socket, "--json"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert watch.stdout is not None
    first = orjson.loads(watch.stdout.readline())
    assert first["role"] == "leader"
    assert d.post("/resign?cooldown=30")[0] == 200
    second = orjson.loads(watch.stdout.readline())
    assert second["revision"] == first["revision"] + 1 and second["role"] == "follower"
    d.signal(signal.SIGTERM)
    # The stream carries the stopped state, then ends: watch exits 0.
    rest = [orjson.loads(line) for line in watch.stdout if line.strip()]
    assert rest and rest[-1]["role"] == "stopped"
    assert watch.wait(10) == 0 and d.wait() == 0


def test_json_logs_are_one_object_per_line(workdir: str) -> None:
    d = Daemon(
        "j",
        "postgresql://leaderd:hunter2@127.0.0.1:9/nowhere",
        workdir=workdir,
        extra_args=["--log-format", "json"],
    ).start()
    wait_for(lambda: "unknown" in d.log(), timeout=10, what="a decision about the election")
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    entries = [orjson.loads(line) for line in d.log().splitlines()]
    assert (
        entries[0]["message"].startswith("leaderd ")
        and "curl --unix-socket" in entries[0]["message"]
    )
    assert all({"time", "level", "message"} <= set(e) for e in entries)
    assert any(e.get("election") == "default" and e.get("event") for e in entries)
    assert "hunter2" not in d.log(), "the password must never be logged"


@pytest.mark.skipif(not shutil.which("systemd-socket-activate"), reason="no systemd installed")
def test_socket_activation_uses_the_passed_socket(workdir: str) -> None:
    path = os.path.join(workdir, "activated.sock")
    # systemd-socket-activate passes on only the variables named with -E: without them the
    # daemon would fall back to the host's own state directory and configuration file.
    passed = [f"-E{name}" for name in ("PYTHONPATH", "LEADERD_CONFIG", "STATE_DIRECTORY",
                                        "RUNTIME_DIRECTORY", "HOSTNAME")]  # fmt: skip
    proc = subprocess.Popen(
        ["systemd-socket-activate", *passed, "-l", path, sys.executable, "-m", "leaderd", "run",
         "--backend", "static://", "--node-id", "sa", "--socket", f"{workdir}/unused.sock"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # systemd-socket-activate starts the daemon on the first connection.
        code, body = wait_for(lambda: (r := curl(path, "/leader"))[0] == 200 and r, timeout=15)
        assert code == 200 and body["node_id"] == "sa"
        assert not os.path.exists(f"{workdir}/unused.sock")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    # Its terms went to the test's state directory, never the host's.
    assert os.path.exists(os.path.join(os.environ["STATE_DIRECTORY"], "static-terms.json"))


def test_quick_start_runs_with_no_configuration(workdir: str) -> None:
    """A bare `leaderd` as an ordinary user: state and socket under its own directories."""
    env = {
        "HOME": workdir,
        "XDG_STATE_HOME": f"{workdir}/state",
        "XDG_RUNTIME_DIR": workdir,
        "RUNTIME_DIRECTORY": workdir,
        "STATE_DIRECTORY": f"{workdir}/state/leaderd",
    }
    d = Daemon("quick", "unused", workdir=workdir, env=env)
    d.args = [sys.executable, "-m", "leaderd"]
    d.socket = f"{workdir}/leaderd.sock"
    d.start().wait_ready()
    wait_for(d.is_leader, timeout=5, what="leadership")
    first_line = d.log().splitlines()[0]
    assert f"curl --unix-socket {d.socket} http://localhost/leader" in first_line
    assert os.path.exists(f"{workdir}/state/leaderd/leaderd.db")
    assert d.stop() == 0


def leaderd(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leaderd", *args],
        capture_output=True, text=True, timeout=30, cwd=cwd, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO), "LEADERD_CONFIG": os.devnull},
    )  # fmt: skip


def test_run_with_an_empty_command_exits_2_with_one_line(workdir: str) -> None:
    """What leaderd@NAME runs when JOB_COMMAND is unset: `leaderd run ... --`."""
    done = leaderd("run", "--backend", "static://", "--socket", f"{workdir}/x.sock", "--")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert "no COMMAND after '--'" in line and "JOB_COMMAND" in line
    assert not os.path.exists(f"{workdir}/x.sock"), "no daemon may have started"


@pytest.mark.parametrize(
    ("content", "key"),
    [
        (b"elections = 5\n", "elections"),
        (b"elections = ['a', 'b']\n", "elections"),
        (b'defaults = "x"\n', "defaults"),
        (b"node_id = 'n\xe9'\n", "not UTF-8"),
    ],
)
def test_malformed_config_file_exits_2_with_one_line(
    workdir: str, content: bytes, key: str
) -> None:
    path = f"{workdir}/leaderd.toml"
    with open(path, "wb") as f:
        f.write(content)
    for command in ("run", "check-config"):
        done = leaderd(command, "-c", path, "--socket", f"{workdir}/x.sock")
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"leaderd: config file {path}") and key in line, line


def test_commands_with_several_elections(workdir: str) -> None:
    d = Daemon("multi", "static://", workdir=workdir, elections=("alpha", "beta")).start()
    d.wait_ready()
    wait_for(lambda: d.get("/leader/beta")[0] == 200, 10, what="leadership")
    status = leaderd("status", "--socket", d.socket)
    assert status.returncode == 0, status.stderr  # leads every election
    rows = status.stdout.splitlines()
    assert rows[0].split()[:2] == ["ELECTION", "ROLE"]
    assert [r.split()[:2] for r in rows[1:]] == [["alpha", "leader"], ["beta", "leader"]]
    for command in ("resign", "watch"):
        done = leaderd(command, "--socket", d.socket)
        assert done.returncode == 2
        assert done.stderr.strip() == (
            "leaderd: several elections run here (alpha, beta): name one with --election NAME"
        )
    resign = leaderd("resign", "--socket", d.socket, "--election", "beta", "--cooldown", "60")
    assert resign.returncode == 0
    assert leaderd("status", "--socket", d.socket, "--election", "alpha").returncode == 0
    assert leaderd("status", "--socket", d.socket, "--election", "beta").returncode == 1
    status = leaderd("status", "--socket", d.socket)
    assert status.returncode == 1  # no longer leads every election
    assert status.stdout.splitlines()[2].split()[:2] == ["beta", "follower"]
    assert (
        len(orjson.loads(leaderd("status", "--socket", d.socket, "--json").stdout)["elections"])
        == 2
    )
    assert d.stop() == 0
