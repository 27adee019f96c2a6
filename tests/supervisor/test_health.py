"""Health checks (leaderd/checks.py, leaderd/health.py, leaderd/eligibility.py): each kind of
check against a real program, server or socket; thresholds and the start-up grace counted
result by result; and the configuration that names them."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from leaderd.startup.config import ConfigError, load
from leaderd.supervision.checks import CheckSpec, Result, probe_of
from leaderd.supervision.health import CheckState, Health

ENV = {"HOSTNAME": "h"}


def run(target: str, timeout: float = 2.0) -> Result:
    return asyncio.run(probe_of(target).run(timeout))


# ---- the kinds of check ----


def test_exec_is_healthy_on_exit_0_and_says_its_last_line() -> None:
    assert run("exec:sh -c 'echo starting; echo all good'") == Result(True, "all good")
    assert run("exec:sh -c 'echo db down >&2; exit 3'") == Result(False, "db down")
    assert run("exec:false") == Result(False, "exit status 1")


def test_exec_runs_no_shell() -> None:
    """A check is split like a shell would, but no shell runs it: `;` is an argument."""
    assert run("exec:echo ok; exit 1") == Result(True, "ok; exit 1")


def test_a_hanging_exec_fails_at_its_timeout_and_its_process_group_is_killed(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    result = run(f"exec:sh -c 'sleep 60 & echo $! > {pidfile}; wait'", timeout=0.3)
    assert result == Result(False, "no answer within 0.3s")
    assert time.monotonic() - started < 30  # not the sleep's minute
    grandchild = int(pidfile.read_text())
    for _ in range(100):  # the group's SIGKILL is delivered asynchronously
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the check's grandchild outlived the check's timeout")


async def _serve_status(status: int, unix: str = "") -> tuple[asyncio.Server, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(f"HTTP/1.1 {status} Whatever\r\nContent-Length: 0\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    if unix:
        return await asyncio.start_unix_server(answer, unix), 0
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (204, True), (503, False)])
def test_http_is_healthy_on_2xx(status: int, healthy: bool) -> None:
    async def probe() -> Result:
        server, port = await _serve_status(status)
        async with server:
            return await probe_of(f"http://127.0.0.1:{port}/healthz").run(2.0)

    assert asyncio.run(probe()) == Result(healthy, f"HTTP {status} Whatever")


def test_unix_is_http_over_a_unix_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "app.sock")

    async def probe() -> Result:
        server, _ = await _serve_status(500, unix=path)
        async with server:
            return await probe_of(f"unix:{path}:/ready").run(2.0)

    assert asyncio.run(probe()) == Result(False, "HTTP 500 Whatever")


def test_tcp_is_healthy_when_it_connects() -> None:
    async def probe() -> tuple[Result, Result]:
        async def close(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        server = await asyncio.start_server(close, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            up = await probe_of(f"tcp://127.0.0.1:{port}").run(2.0)
        return up, await probe_of(f"tcp://127.0.0.1:{port}").run(2.0)

    up, down = asyncio.run(probe())
    assert up.healthy and not down.healthy and "connect" in down.output.lower()


# ---- thresholds and grace ----


def results(state: CheckState, passes: str, at: float = 100.0) -> list[str]:
    """Feed results ("+" pass, "-" fail) one second apart; the state after each."""
    seen = []
    for i, mark in enumerate(passes):
        state.record(Result(mark == "+", mark), 0.01, at + i)
        seen.append(state.state)
    return seen


def check(failures: int = 3, successes: int = 1, grace: float = 0.0) -> CheckState:
    spec = CheckSpec("exec:true", failures=failures, successes=successes, grace=grace)
    return CheckState(spec, probe_of(spec.target), started_at=100.0)


def test_a_node_is_starting_until_its_first_successes() -> None:
    assert results(check(successes=2), "-+-++") == [
        "starting", "starting", "starting", "starting", "healthy",
    ]  # fmt: skip


def test_thresholds_are_consecutive_results() -> None:
    """A flapping check never crosses a threshold of 2: its health never changes."""
    state = check(failures=2, successes=2)
    assert results(state, "++")[-1] == "healthy"
    assert set(results(state, "-+-+-+-+", at=200)) == {"healthy"}
    assert results(state, "--", at=300) == ["healthy", "unhealthy"]
    assert set(results(state, "+-+-+-", at=400)) == {"unhealthy"}
    assert results(state, "++", at=500) == ["unhealthy", "healthy"]
    assert state.consecutive_failures == 0 and state.results == {True: 11, False: 9}


def test_failures_within_the_grace_do_not_count() -> None:
    state = check(failures=1, grace=5.0)
    assert results(state, "-----") == ["starting"] * 5  # seconds 0-4 after the start
    assert results(state, "-", at=105.0) == ["unhealthy"]


def test_the_election_is_unhealthy_while_any_of_its_checks_is_not() -> None:
    health, told = Health(), []
    ok, down = CheckSpec("exec:true"), CheckSpec("exec:false")
    assert health.attach("a", [ok, down], lambda: told.append("a"))() != ""
    assert health.attach("b", [ok], lambda: told.append("b"))() != ""  # starting
    health.checks[ok].record(Result(True, "fine"), 0.0, 1.0)
    health._changed(health.checks[ok])
    assert health.unhealthy("b") == "" and told == ["a", "b"]
    assert health.unhealthy("a") == "exec:false: not run yet"
    assert len(health.checks) == 2  # exec:true runs once for both elections


# ---- configuration ----


def test_checks_for_all_and_for_one_election(tmp_path: Path) -> None:
    path = tmp_path / "leaderd.toml"
    path.write_text(
        'check = ["exec:true"]\ncheck_interval = 3\npriority = 2\n'
        "[elections.a]\n"
        'check = [{target = "tcp://127.0.0.1:9", timeout = 0.5}]\non_unhealthy = "keep"\n'
        "[elections.b]\npriority = 0\nfailback = 30\n"
    )
    a, b = load({"elections": None}, ENV, file=str(path)).elections
    assert [c.target for c in a.eligibility.checks] == ["exec:true", "tcp://127.0.0.1:9"]
    assert [c.interval for c in a.eligibility.checks] == [3.0, 3.0]
    assert a.eligibility.checks[1].timeout == 0.5
    assert (a.eligibility.priority, a.eligibility.on_unhealthy) == (2, "keep")
    assert (b.eligibility.priority, b.eligibility.on_unhealthy) == (0, "handover")
    assert (a.eligibility.failback, b.eligibility.failback) == (None, 30.0)  # off by default
    flags = {"check": ["http://127.0.0.1:8080/ok"], "priority": 5}
    a, _ = load(flags, ENV, file=str(path)).elections
    assert [c.target for c in a.eligibility.checks] == ["http://127.0.0.1:8080/ok",
                                                        "tcp://127.0.0.1:9"]  # fmt: skip
    assert a.eligibility.priority == 5  # a flag beats the election's table


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"check": ["exec:/no/such/program --x"]}, "/no/such/program is not an executable"),
        ({"check": ["exec:"]}, "names no command"),
        ({"check": ["ftp://h:1"]}, "write exec:CMD"),
        ({"check": ["http://user:pw@h:1/"]}, "no user or password"),
        ({"check": ["tcp://h"]}, "a port"),
        ({"check": ["tcp://h:1"], "check_timeout": 9.0}, "timeout <= interval"),
        ({"check": ["tcp://h:1"], "check_failures": 0}, "thresholds must be >= 1"),
        ({"priority": -1}, "priority must be a whole number from 0"),
    ],
)
def test_a_check_that_cannot_run_is_a_configuration_error(
    flags: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load(flags, ENV)
    assert message in str(err.value) and "\n" not in str(err.value)
