"""The command line for scripts and people (README, docs/operations.md "Who leads?"):
--timeout against a frozen daemon, one JSON shape, exit codes that tell a follower from a
node that does not know, help for every option, and socket errors said plainly."""

from __future__ import annotations

import argparse
import os
import signal

import orjson
import pytest

from leaderd.startup import cli
from tests.support.daemons import Daemon, leaderd_cli, wait_for

pytestmark = pytest.mark.slow

CLIENT_COMMANDS = ("status", "watch", "resign", "members", "history")


def test_every_command_gives_up_on_a_frozen_daemon_after_its_timeout(workdir: str) -> None:
    """A stopped daemon accepts connections (the kernel does) and never answers: status
    waited a hard-coded 10 s, watch for ever."""
    d = Daemon("frozen", "static://", workdir=workdir).start()
    d.wait_ready()
    os.kill(d.pid, signal.SIGSTOP)
    try:
        for command in CLIENT_COMMANDS:
            done = leaderd_cli(command, "--socket", d.socket, "--timeout", "0.5")
            assert done.returncode == 3, (command, done.stderr)
            assert done.stderr == (
                f"leaderd: no leaderd answers on {d.socket}: no answer within 0.5s (--timeout)\n"
            )
    finally:
        os.kill(d.pid, signal.SIGCONT)
    assert d.stop() == 0


@pytest.mark.parametrize("elections", [("default",), ("alpha", "beta")])
def test_status_json_has_one_shape(workdir: str, elections: tuple[str, ...]) -> None:
    """It printed an ElectionStatus for one election and a list for several."""
    d = Daemon("shape", "static://", workdir=workdir, elections=elections).start()
    d.wait_ready()
    wait_for(lambda: leaderd_cli("status", "-q", "--socket", d.socket).returncode == 0, 10)
    body = orjson.loads(leaderd_cli("status", "--json", "--socket", d.socket).stdout)
    assert set(body) == set(d.get("/status")[1])
    assert list(body["elections"]) == list(elections)
    assert all(s["is_leader"] for s in body["elections"].values())
    one = leaderd_cli("status", "--json", "--socket", d.socket, "--election", elections[-1])
    assert list(orjson.loads(one.stdout)["elections"]) == [elections[-1]]
    assert d.stop() == 0


def test_status_tells_a_follower_from_a_node_that_does_not_know(workdir: str) -> None:
    """Both exited 1; a node cut off from its backend now exits 4 and says why."""
    lease = f"sqlite://{workdir}/lease.db"
    leader = Daemon("a", lease, workdir=workdir).start()
    leader.wait_ready()
    wait_for(leader.is_leader, 10, what="a leader")
    follower = Daemon("b", lease, workdir=workdir).start()
    follower.wait_ready()
    done = leaderd_cli("status", "--socket", follower.socket)
    assert done.returncode == 1 and done.stderr == "", done.stderr
    cut_off = Daemon("c", "postgresql://leaderd@127.0.0.1:9/nowhere", workdir=workdir).start()
    wait_for(lambda: last_error(cut_off), 30, what="an error")
    done = leaderd_cli("status", "--socket", cut_off.socket)
    assert done.returncode == 4, done.stderr
    assert "unknown" in done.stdout
    (line,) = done.stderr.splitlines()
    assert line.startswith("leaderd: role unknown in default: ") and "127.0.0.1:9" in line, line
    assert last_error(cut_off).split(":")[0] in line
    assert leaderd_cli("status", "-q", "--socket", cut_off.socket).stderr == ""
    for d in (cut_off, follower, leader):
        assert d.stop() == 0


def last_error(d: Daemon) -> str | None:
    code, body = d.get("/status")
    return body["backend"]["last_error"] if code == 200 else None


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli._parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_option_of_every_command_has_help() -> None:
    """--socket and --election had none."""
    for name, parser in subparsers().items():
        for action in parser._actions:
            assert action.help, (name, action.option_strings)
    for name in CLIENT_COMMANDS:
        assert "--timeout" in subparsers()[name].format_help(), name


def test_run_help_shows_the_command_and_every_backend() -> None:
    done = leaderd_cli("run", "--help")
    assert done.returncode == 0
    assert done.stdout.startswith("usage: leaderd run [options] [-- COMMAND [ARG...]]\n")
    assert "etcd://" in done.stdout


def test_socket_path_over_108_bytes_is_a_configuration_error(workdir: str) -> None:
    """It said "cannot listen on ...: None" after start."""
    path = os.path.join(workdir, "s" * (109 - len(workdir) - 1))
    assert len(path) == 109
    for command in ("check-config", "run"):
        done = leaderd_cli(command, "--backend", "static://", "--socket", path,
                           env={"STATE_DIRECTORY": workdir})  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert done.stderr == (
            f"leaderd: socket path {path} is 109 bytes; a Unix socket path has at most 108: "
            "choose a shorter --socket\n"
        )
    done = leaderd_cli("check-config", "--backend", "static://", "--socket", path[:-1],
                       env={"STATE_DIRECTORY": workdir})  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_curl_hint_comes_only_once_the_socket_listens(workdir: str) -> None:
    """It was logged before the bind, then the bind failed: a hint that cannot work."""
    blocker = os.path.join(workdir, "file")
    open(blocker, "w").close()
    d = Daemon("nobind", "static://", workdir=workdir, socket=f"{blocker}/s.sock").start()
    assert d.wait() == 2
    assert "socket directory" in d.log() and "try: curl" not in d.log(), d.log()
    ok = Daemon("bound", "static://", workdir=workdir).start()
    ok.wait_ready()
    assert f"try: curl --unix-socket {ok.socket} " in ok.log()
    assert ok.stop() == 0
