"""Real daemons on one SQLite file, real signals, queried with curl --unix-socket."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import switchover
from tests.support.daemons import REPO, Daemon, curl, leaders, released_to, short_tempdir, wait_for

TTL, RENEW, RETRY = 2.0, 0.5, 0.25


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir()
    yield path
    subprocess.run(["rm", "-rf", path], check=False)


@pytest.fixture
def cluster(workdir: str) -> Iterator[list[Daemon]]:
    db = f"sqlite://{workdir}/lease.db"
    daemons = [Daemon(f"node-{i}", db, workdir=workdir).start() for i in range(3)]
    for d in daemons:
        d.wait_ready()
    yield daemons
    for d in daemons:
        d.kill()


def leaderd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leaderd", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        check=False,
    )


def the_leader(daemons: list[Daemon]) -> Daemon:
    found = wait_for(lambda: leaders(daemons), timeout=TTL + RETRY + 2, what="a leader")
    assert len(found) == 1, [d.node_id for d in found]
    return found[0]


def test_three_daemons_elect_exactly_one_leader(cluster: list[Daemon]) -> None:
    leader = the_leader(cluster)
    for _ in range(10):
        assert leaders(cluster) == [leader]
        time.sleep(0.1)
    code, body = leader.get("/leader")
    assert code == 200 and body["is_leader"] and body["leader"]["node_id"] == leader.node_id
    assert body["lease"]["ttl_ms"] == 2000 and 0 < body["lease"]["valid_for_ms"] <= 2000
    follower = next(d for d in cluster if d is not leader)
    code, body = follower.get("/leader")
    assert code == 503 and body["role"] == "follower"
    assert body["leader"]["node_id"] == leader.node_id and body["term"] == body["leader"]["term"]


def test_sigterm_hands_over_and_followers_watch_it(cluster: list[Daemon]) -> None:
    leader = the_leader(cluster)
    followers = [d for d in cluster if d is not leader]
    _, before = followers[0].get("/leader")
    answers: list[tuple[int, object]] = []
    watch = f"/watch?revision={before['revision']}&timeout=20"
    watcher = threading.Thread(target=lambda: answers.append(followers[0].get(watch, 25)))
    watcher.start()
    time.sleep(0.2)
    leader.signal(signal.SIGTERM)
    assert leader.wait() == 0
    assert "released election default" in leader.log()
    new = the_leader(followers)
    _, status = new.get("/leader")
    assert status["term"] > before["term"]
    watcher.join(25)
    code, seen = answers[0]
    assert code == 200 and isinstance(seen, dict)
    assert seen["revision"] > before["revision"]
    # The first change the follower saw was the old leader leaving or the new one coming.
    assert seen["leader"] is None or seen["leader"]["node_id"] != leader.node_id


def test_sigterm_grants_the_lease_to_a_standby_that_leads_without_a_write(
    cluster: list[Daemon],
) -> None:
    switchover.sigterm_grants_the_lease(cluster, TTL)


def test_a_frozen_heir_is_taken_over_within_a_ttl_and_never_leads_after_sigcont(
    cluster: list[Daemon],
) -> None:
    switchover.frozen_heir_is_taken_over(
        cluster, TTL, 2 * RETRY, 3 * TTL + 1, "taken over after expiry"
    )


def test_sigkill_leader_is_replaced_within_ttl_plus_retry(cluster: list[Daemon]) -> None:
    leader = the_leader(cluster)
    _, before = leader.get("/leader")
    leader.kill()
    killed_at = time.monotonic()
    followers = [d for d in cluster if d is not leader]
    new = the_leader(followers)
    took = time.monotonic() - killed_at
    # The contract bound, plus room for a busy 2-core machine and the polling.
    assert took <= TTL + RETRY + 1.5, took
    _, after = new.get("/leader")
    assert after["term"] == before["term"] + 1


def test_sigterm_while_campaigning_exits_cleanly(workdir: str) -> None:
    d = Daemon("early", f"sqlite://{workdir}/lease.db", workdir=workdir).start()
    wait_for(lambda: os.path.exists(d.socket), timeout=10, what="the socket")
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    assert not os.path.exists(d.socket), "the socket file is removed on exit"


def _reader_waits(fifo: str) -> int | None:
    """A write end of ``fifo`` once someone has it open for reading, else None."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return None


def test_sigterm_while_starting_exits_cleanly(workdir: str) -> None:
    """A stop that comes before the event loop runs (here: while the daemon reads its
    configuration from a FIFO) is kept and honoured: exit 0, not death by SIGTERM."""
    fifo = os.path.join(workdir, "leaderd.toml")
    os.mkfifo(fifo)
    d = Daemon("starting", f"sqlite://{workdir}/lease.db", workdir=workdir,
               extra_args=["-c", fifo]).start()  # fmt: skip
    writer = wait_for(lambda: _reader_waits(fifo), timeout=10, what="the daemon to read")
    d.signal(signal.SIGTERM)
    time.sleep(0.2)
    with os.fdopen(writer, "w") as f:  # now let it read its configuration and go on
        f.write('node_id = "starting"\n')
    assert d.wait() == 0, d.log()
    assert "received SIGTERM" in d.log()
    assert "acquired election" not in d.log()


def test_second_sigterm_does_not_skip_the_release(workdir: str) -> None:
    d = Daemon("twice", f"sqlite://{workdir}/lease.db", workdir=workdir).start()
    d.wait_ready()
    wait_for(d.is_leader, timeout=5, what="leadership")
    d.signal(signal.SIGTERM)
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    assert "released election default" in d.log()


@pytest.mark.parametrize("stopped_by", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_leader_writes_its_whole_log_to_a_pipe_and_exits_0(
    workdir: str, stopped_by: signal.Signals
) -> None:
    """The daemon ends without the interpreter's teardown (cli._exit_now): what that teardown
    would do must still happen. Every line reaches a pipe (how systemd and kubectl read
    stderr), the last one the exit, and the exit status is the daemon's."""
    d = Daemon("piped", f"sqlite://{workdir}/lease.db", workdir=workdir,
               extra_args=["--log-format", "json"])  # fmt: skip
    proc = subprocess.Popen(d.args, stderr=subprocess.PIPE, env=d.env, start_new_session=True)
    d.proc = proc
    Daemon.started.append(d)
    wait_for(d.is_leader, timeout=10, what="leadership")
    term = int(d.get("/leader")[1]["term"])
    proc.send_signal(stopped_by)
    _, stderr = proc.communicate(timeout=15)
    assert proc.returncode == 0, stderr.decode()
    entries = [json.loads(line) for line in stderr.decode().splitlines()]
    decisions = [e for e in entries if "event" in e]  # not the libraries' debug lines
    events = [e["event"] for e in decisions]
    assert events[-1] == "exited" and decisions[-1]["status"] == 0, decisions[-3:]
    assert events.index("stopping") < events.index("released") < len(events) - 1
    # Released, not left to lapse: the next daemon's history says so, whenever it starts.
    follower = Daemon("after", d.backend, workdir=workdir).start()
    follower.wait_ready()
    released_to(follower, d, term, timeout=TTL + RETRY + 5)


def test_status_command_exit_codes(cluster: list[Daemon], workdir: str) -> None:
    leader = the_leader(cluster)
    follower = next(d for d in cluster if d is not leader)
    assert leaderd("status", "-q", "--socket", leader.socket).returncode == 0
    assert leaderd("status", "-q", "--socket", follower.socket).returncode == 1
    assert leaderd("status", "-q", "--socket", f"{workdir}/nobody.sock").returncode == 3
    unknown = leaderd("status", "--socket", leader.socket, "--election", "nope")
    assert unknown.returncode == 2 and "nope" in unknown.stderr
    table = leaderd("status", "--socket", follower.socket)
    assert table.returncode == 1
    assert "follower" in table.stdout and leader.node_id in table.stdout
    resign = leaderd("resign", "--socket", leader.socket, "--cooldown", "5")
    assert resign.returncode == 0
    assert leaderd("status", "-q", "--socket", leader.socket).returncode == 1
    the_leader([d for d in cluster if d is not leader])


def test_socket_created_with_mode_and_missing_directory(workdir: str) -> None:
    sock_dir = os.path.join(workdir, "deep", "run")
    d = Daemon("modes", "static://", workdir=workdir, socket=f"{sock_dir}/leaderd.sock")
    d.start().wait_ready()
    assert stat.S_IMODE(os.stat(d.socket).st_mode) == 0o660
    assert stat.S_IMODE(os.stat(sock_dir).st_mode) == 0o755
    assert curl(d.socket, "/leader")[0] == 200
    assert d.stop() == 0


def test_live_socket_is_never_stolen_but_stale_one_is_replaced(workdir: str) -> None:
    first = Daemon("first", "static://", workdir=workdir).start()
    first.wait_ready()
    thief = Daemon("thief", "static://", workdir=workdir, socket=first.socket).start()
    assert thief.wait() == 2
    assert "in use" in thief.log()
    assert curl(first.socket, "/leader")[1]["node_id"] == "first"
    first.kill()  # SIGKILL leaves its socket file behind
    assert os.path.exists(first.socket)
    heir = Daemon("heir", "static://", workdir=workdir, socket=first.socket).start()
    heir.wait_ready()
    assert curl(first.socket, "/leader")[1]["node_id"] == "heir"
    assert heir.stop() == 0


@pytest.mark.parametrize(
    ("flags", "rule"),
    [
        (
            ["--ttl", "1", "--renew-interval", "0.5", "--retry-interval", "0.25"],
            "ttl (1s) must be greater than renew_interval * 2",
        ),
        (
            ["--renew-interval", "1", "--retry-interval", "2"],
            "renew_interval (1s) must be >= retry_interval",
        ),
        (["--retry-interval", "0"], "retry_interval must be > 0"),
        (["--clock-drift", "0.2"], "clock_drift must be in [0, 0.1)"),
        (
            [
                "--ttl",
                "3",
                "--renew-interval",
                "1",
                "--retry-interval",
                "1",
                "--safety-margin",
                "2.5",
            ],
            "must exceed renew_interval",
        ),
        (["--listen", "nowhere"], "listen must be HOST:PORT"),
        (["--backend", "mysql://x"], "unknown backend"),
    ],
)
def test_bad_configuration_exits_2_with_one_line(flags: list[str], rule: str, workdir: str) -> None:
    result = leaderd("run", "--socket", f"{workdir}/x.sock", *flags)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and rule in lines[0], result.stderr
    assert leaderd("check-config", "--socket", f"{workdir}/x.sock", *flags).returncode == 2


def test_corrupt_sqlite_file_exits_1_with_a_clear_error(workdir: str) -> None:
    db = Path(workdir) / "corrupt.db"
    db.write_bytes(b"this is not a database at all" * 200)
    d = Daemon("corrupt", f"sqlite://{db}", workdir=workdir).start()
    assert d.wait() == 1
    assert str(db) in d.log() and "Traceback" not in d.log()


def test_version_and_check_config(workdir: str) -> None:
    version = leaderd("--version")
    assert version.returncode == 0 and version.stdout.startswith("leaderd ")
    ok = leaderd("check-config", "--backend", "postgresql://u:hunter2@db/x", "--node-id", "n")
    assert ok.returncode == 0 and "hunter2" not in ok.stdout and "***" in ok.stdout


def test_systemd_notifications(workdir: str) -> None:
    notify_path = os.path.join(workdir, "notify.sock")
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(notify_path)
    sink.settimeout(10)
    env = {"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "400000"}
    d = Daemon("sd", f"sqlite://{workdir}/lease.db", workdir=workdir, env=env).start()
    messages: list[str] = []

    def receive_until(word: str) -> None:
        while not any(word in m for m in messages):
            messages.append(sink.recv(4096).decode())

    receive_until("READY=1")
    ready = next(m for m in messages if "READY=1" in m)
    assert "STATUS=default: leader (leader sd, term" in ready
    receive_until("WATCHDOG=1")
    d.signal(signal.SIGTERM)
    receive_until("STOPPING=1")
    assert d.wait() == 0
    sink.close()


def test_tcp_listener_is_read_only_and_a_taken_port_exits_2(workdir: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    d = Daemon("tcp", "static://", workdir=workdir, extra_args=["--listen", f"127.0.0.1:{port}"])
    d.start().wait_ready()
    url = f"http://127.0.0.1:{port}"
    get = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"{url}/health"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert get.stdout == "200"
    post = subprocess.run(["curl", "-s", "-X", "POST", "-w", "\n%{http_code}", f"{url}/resign"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert post.stdout.endswith("\n403") and '"read_only"' in post.stdout
    assert d.is_leader(), "a POST on the read-only listener must not resign"
    taken = Daemon(
        "taken", "static://", workdir=workdir, extra_args=["--listen", f"127.0.0.1:{port}"]
    )
    taken.start()
    assert taken.wait() == 2
    assert f"cannot listen on 127.0.0.1:{port}" in taken.log()
    assert not os.path.exists(taken.socket)
    assert d.stop() == 0
