"""`leaderd run --once-per PERIOD -- JOB` with real daemons on a real SQLite file and the
suite's real PostgreSQL: the job appends one line per run to a shared file, and a failover in
mid-period (SIGTERM, SIGKILL) never runs it again within the period."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemons import Daemon, leaderd_cli, leaders, short_tempdir, wait_for
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.slow

PERIOD = 4.0
TTL = 2.0
# The job writes the start the backend recorded for it (milliseconds), not a stamp of its own:
# a job's own clock read waits for its interpreter, which a loaded host delays at random.
STAMP_JITTER = 0.002
JOB = """
import os, sys, time
env = os.environ
line = "%s %s %s %s\\n" % (env["LEADERD_JOB_RUN"], env["LEADERD_NODE_ID"], env["LEADERD_TERM"],
                          env["LEADERD_JOB_STARTED_AT"])
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
time.sleep(float(sys.argv[2]))
"""


@dataclass
class Run:
    run: int
    node: str
    term: int
    at: float


class Cluster:
    def __init__(
        self, workdir: str, backend: str, job_seconds: float = 0.0, period: float = PERIOD
    ) -> None:
        self.workdir, self.backend, self.period = workdir, backend, period
        self.out = os.path.join(workdir, "runs")
        self.command = [sys.executable, "-c", JOB, self.out, str(job_seconds)]
        self.daemons: list[Daemon] = []

    def start(self, node_id: str, *extra: str) -> Daemon:
        d = Daemon(node_id, self.backend, workdir=self.workdir, ttl=TTL,
                   extra_args=("--once-per", f"{self.period:g}s", "--kill-grace", "0.5", *extra),
                   command=self.command).start()  # fmt: skip
        d.wait_ready()
        self.daemons.append(d)
        return d

    def runs(self) -> list[Run]:
        try:
            with open(self.out) as f:
                lines = [line.split() for line in f]
        except FileNotFoundError:
            return []
        return [Run(int(r), n, int(t), float(a)) for r, n, t, a in lines]

    def leader(self) -> Daemon:
        found: list[Daemon] = wait_for(lambda: leaders(self.daemons), timeout=15, what="a leader")
        return found[0]

    def until_runs(self, count: int, timeout: float = 3 * PERIOD) -> list[Run]:
        runs: list[Run] = wait_for(lambda: len(self.runs()) >= count and self.runs(),
                                   timeout=timeout, what=f"{count} runs")  # fmt: skip
        return runs


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    workdir = short_tempdir("ld-op-")
    request.node.workdir = workdir
    if request.param == "sqlite":
        yield f"sqlite://{workdir}/lease.db"
    else:
        pg: PgServer = request.getfixturevalue("pg_server")
        table = f"once_{uuid.uuid4().hex[:8]}"
        yield pg.dsn(table=table)
        pg.psql(f"DROP TABLE IF EXISTS {table}, {table}_members, {table}_history, {table}_jobs")
        pg.psql(f"DROP FUNCTION IF EXISTS {table}_fence(text, bigint)")
    shutil.rmtree(workdir, ignore_errors=True)


def last_run(d: Daemon) -> dict[str, Any]:
    job: dict[str, Any] = d.get("/jobs")[1]["jobs"][0]
    return job


def assert_once_per_period(runs: list[Run], period: float = PERIOD) -> None:
    """Every recorded run ran once, in order, a period apart."""
    assert [r.run for r in runs] == list(range(1, len(runs) + 1)), runs
    gaps = [b.at - a.at for a, b in itertools.pairwise(runs)]
    assert all(gap >= period - STAMP_JITTER for gap in gaps), (gaps, runs)


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_failover_in_mid_period_does_not_run_the_job_again(
    backend: str, nodes: int, request: pytest.FixtureRequest
) -> None:
    cluster = Cluster(request.node.workdir, backend)
    for i in range(nodes):
        cluster.start(f"node-{chr(ord('a') + i)}")
    base = len(cluster.until_runs(1))  # the daemons start one by one: a run or more by now
    first = cluster.until_runs(base + 1)[base]  # a period begins
    old = cluster.leader()
    assert old.node_id == first.node
    old.signal(signal.SIGTERM)  # a graceful hand-over, just after the run: mid-period
    assert old.wait() == 0
    cluster.daemons.remove(old)
    successor = cluster.leader()
    second = cluster.until_runs(base + 2)[base + 1]
    assert second.node == successor.node_id and second.term > first.term
    if nodes == 3:
        successor.kill()  # a crash in mid-period: the last node takes over after one ttl
        cluster.daemons.remove(successor)
        third = cluster.until_runs(base + 3, timeout=3 * PERIOD + TTL)[base + 2]
        assert third.node == cluster.leader().node_id
    time.sleep(PERIOD / 2)  # mid-period again: nothing more may run
    runs = cluster.runs()
    assert len(runs) == base + nodes, runs
    assert_once_per_period(runs)
    jobs = cluster.leader().get("/jobs")[1]["jobs"][0]
    assert (jobs["runs"], jobs["status"], jobs["exit_code"]) == (base + nodes, "succeeded", 0)


def test_a_job_running_when_leadership_is_lost_is_stopped_and_not_run_again(
    backend: str, request: pytest.FixtureRequest
) -> None:
    period = 10.0
    cluster = Cluster(request.node.workdir, backend, job_seconds=60, period=period)
    a = cluster.start("node-a")
    first = cluster.until_runs(1)[0]
    b = cluster.start("node-b")
    assert a.post("/resign?cooldown=60")[0] == 200  # the job still runs
    wait_for(lambda: b.is_leader(), timeout=10, what="node-b to lead")
    jobs = wait_for(lambda: last_run(a)["status"] == "stopped" and last_run(a), timeout=10,
                    what="the run recorded stopped")  # fmt: skip
    assert jobs["runs"] == 1 and jobs["started_by"] == "node-a"
    assert "stopping child" in a.log()
    # first.at is the recorded start: the backend's clock, this host's wall clock here.
    time.sleep(max(0.0, first.at + period * 0.6 - time.time()))
    assert len(cluster.runs()) == 1  # node-b waits for the period to end
    second = cluster.until_runs(2, timeout=2 * period)[1]
    assert second.node == "node-b"
    assert_once_per_period(cluster.runs(), period)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--once-per", "1h", "--backend", "etcd://127.0.0.1:1/", "--", "true"],
         "--once-per records its runs in a sqlite:// or postgresql:// backend"),
        (["--once-per", "1h"], "--once-per goes with -- COMMAND"),
        (["--catch-up", "--", "true"], "--catch-up goes with --once-per"),
        (["--once-per", "0s", "--", "true"], "is no duration > 0"),
    ],
)  # fmt: skip
def test_once_per_misuse_is_refused_at_start(args: list[str], says: str, tmp_path: Path) -> None:
    done = leaderd_cli("run", "--socket", str(tmp_path / "s.sock"), *args)
    assert done.returncode == 2 and says in done.stderr, done.stderr
