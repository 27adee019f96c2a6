"""Health-gated candidacy with real daemons on SQLite (docs/run.md, "Health checks"): a
leader whose check fails hands over, an unhealthy standby is never handed the lease, a
flapping check moves leadership no faster than its thresholds allow, and a check that
cannot run stops the daemon at start with exit 2. The referee judges every /leader answer."""

from __future__ import annotations

import http.server
import os
import signal
import socketserver
import threading
import time
from pathlib import Path

import pytest

from tests.process.test_members import url  # noqa: F401 - every backend's URL
from tests.support.daemons import Daemon, end_of, leaderd_cli, leaders, metric, wait_for
from tests.support.etcd_fixtures import etcd_cluster  # noqa: F401 - the etcd URL's fixture
from tests.support.pg_fixtures import pg_server  # noqa: F401 - the PostgreSQL URLs' fixture
from tests.support.referee import Referee

pytestmark = pytest.mark.slow

TTL = 2.0
SLACK = 5.0  # a busy 2-core machine
INTERVAL = 0.2  # each check's interval and timeout: a unix: check answers from a thread here
# An exec: check starts a process, which a loaded host can delay past 0.2 s: a failing one
# must fail with its own exit status, not a timeout (a timeout is at most the interval).
EXEC_INTERVAL = 1.0


def start(node_id: str, workdir: str, check: str, *more: str, backend: str = "") -> Daemon:
    every = str(EXEC_INTERVAL if check.startswith("exec:") else INTERVAL)
    args = ["--check", check, "--check-interval", every, "--check-timeout", every, *more]
    backend = backend or f"sqlite://{workdir}/lease.db"
    return Daemon(node_id, backend, workdir=workdir, ttl=TTL, extra_args=args).start()


def file_check(workdir: str, node_id: str) -> str:
    """A check that passes while the node's file exists; the file is created."""
    flag = Path(workdir) / f"{node_id}.ok"
    flag.touch()
    return f"exec:test -e {flag}"


def the_leader(daemons: list[Daemon]) -> Daemon:
    found = wait_for(lambda: leaders(daemons), timeout=TTL + SLACK, what="a leader")
    assert len(found) == 1, [d.node_id for d in found]
    return found[0]


def member(d: Daemon, node_id: str) -> dict[str, object]:
    listed = d.get("/members")[1]["members"]
    return next((m for m in listed if m["node_id"] == node_id), {"role": None})


def test_a_leader_whose_check_fails_hands_over_to_a_healthy_standby(
    url: tuple[str, str, str],  # noqa: F811 - the fixture
) -> None:
    """On every backend: on those that grant, the release hands it over; on the advisory
    lock, the healthy standby takes the freed lock."""
    _, backend, workdir = url
    daemons = [start(n, workdir, file_check(workdir, n), "--check-failures", "2",
                     backend=backend) for n in ("node-a", "node-b")]  # fmt: skip
    with Referee(daemons):
        leader = the_leader(daemons)
        other = next(d for d in daemons if d is not leader)
        term = leader.get("/leader")[1]["term"]
        wait_for(lambda: member(leader, other.node_id)["role"] == "standby", TTL + SLACK,
                 what="the standby listed healthy")  # fmt: skip
        os.unlink(Path(workdir) / f"{leader.node_id}.ok")
        wait_for(lambda: other.is_leader(), timeout=SLACK, what="the healthy standby leads")
        assert not leader.is_leader()
        # Its last renewals as leader carried its health too; then it stopped campaigning.
        sick = wait_for(lambda: (m := member(other, leader.node_id))["role"] == "unhealthy"
                        and not m["campaigning"] and m, timeout=SLACK,
                        what="the old leader listed unhealthy, not campaigning")  # fmt: skip
        assert sick["health"] == f"exec:test -e {workdir}/{leader.node_id}.ok: exit status 1"
        why = f"exec:test -e {workdir}/{leader.node_id}.ok: exit status 1"
        ended = end_of(other, term, SLACK)
        assert ended == (term, leader.node_id, f"handed over: leader unhealthy ({why})")
        status = leader.get("/status")[1]
        [check] = status["checks"]
        assert (check["state"], check["healthy"]) == ("unhealthy", False)
        assert check["consecutive_failures"] >= 2
        assert metric(leader, 'leaderd_check_results_total{check="exec:test') > 0
        told = leaderd_cli("status", "--socket", leader.socket)
        assert f"check exec:test -e {workdir}/{leader.node_id}.ok: unhealthy" in told.stdout
        time.sleep(TTL)  # it stays out while its check fails: no lease comes back to it
        assert leaders(daemons) == [other]
    for d in daemons:
        assert d.stop() == 0


def test_an_unhealthy_standby_is_never_handed_the_lease(workdir: str) -> None:
    """The only standby is unhealthy: the leader's release grants it nothing, and it never
    takes the free lease either (it does not campaign)."""
    a = start("node-a", workdir, file_check(workdir, "node-a"))
    the_leader([a])
    b = start("node-b", workdir, f"exec:test -e {workdir}/never")
    wait_for(lambda: member(a, "node-b")["role"] == "unhealthy", TTL + SLACK,
             what="node-b listed unhealthy")  # fmt: skip
    assert a.stop() == 0
    time.sleep(TTL + 1.0)  # longer than any takeover
    assert not b.is_leader()
    assert b.get("/leader")[1]["role"] == "follower"
    Path(f"{workdir}/never").touch()
    wait_for(lambda: b.is_leader(), timeout=SLACK, what="node-b leads once healthy")
    assert b.stop() == 0


class Flapping(socketserver.UnixStreamServer):
    """An application whose health answer flips on every check: 200, 503, 200, ... It
    answers on a Unix socket from a thread of the test, so a check costs no process start,
    which a loaded host can delay past the check's timeout (a second failure in a row)."""

    def __init__(self, path: str) -> None:
        self.answered = 0
        super().__init__(path, _FlipHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _FlipHandler(http.server.BaseHTTPRequestHandler):
    server: Flapping

    def do_GET(self) -> None:
        healthy = self.server.answered % 2 == 0
        self.server.answered += 1
        self.send_response(200 if healthy else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize(("failures", "moves"), [(2, False), (1, True)])
def test_a_flapping_check_moves_leadership_no_faster_than_its_thresholds(
    workdir: str, failures: int, moves: bool
) -> None:
    """A check that fails every other run never reaches 2 failures in a row: the leader
    keeps the lease. With a threshold of 1 the same check hands it over (the contrast
    proves the flapping reaches the daemon)."""
    app = Flapping(os.path.join(workdir, "app.sock"))
    flapping = f"unix:{app.server_address}:/health"
    steady = file_check(workdir, "node-b")
    a = start("node-a", workdir, flapping, "--check-failures", str(failures))
    the_leader([a])
    b = start("node-b", workdir, steady)
    daemons = [a, b]
    with Referee(daemons):
        if moves:
            wait_for(lambda: b.is_leader(), timeout=TTL + SLACK, what="the hand-over")
        else:
            wait_for(lambda: member(a, "node-b")["role"] == "standby", TTL + SLACK,
                     what="node-b listed healthy")  # fmt: skip
            before = app.answered
            while app.answered - before < 8:  # 4 failures and 4 successes at least
                assert leaders(daemons) == [a]
                time.sleep(0.05)
    for d in daemons:
        d.signal(signal.SIGTERM)
    assert [d.wait() for d in daemons] == [0, 0]
    app.shutdown()
    app.server_close()


def test_a_check_leaderd_cannot_run_exits_2_at_start(workdir: str) -> None:
    backend, sock = f"sqlite://{workdir}/lease.db", f"{workdir}/a.sock"
    done = leaderd_cli("run", "--backend", backend, "--node-id", "a", "--socket", sock,
                       "--check", "exec:/no/such/probe -q")  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "/no/such/probe is not an executable program" in done.stderr
    assert not os.path.exists(f"{workdir}/a.sock")
