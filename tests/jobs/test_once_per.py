"""`leaderd run --once-per PERIOD -- JOB` with real daemons on every backend that keeps its
record (a real SQLite file, the suite's real PostgreSQL with the lease table and with the
advisory lock, etcd cluster and kube-apiserver): the job appends one line per run to a
shared file, and a failover in mid-period (SIGTERM, SIGKILL) never runs it again within the
period. Each test waits on runs (the file) and the daemons' answers, not on time: a failover
starts right after a run, so it is mid-period, and the next run's recorded start must be a
whole period after it."""

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

from tests.support.daemons import (
    Daemon,
    frozen_outside_a_write,
    history,
    leaderd_cli,
    leaders,
    short_tempdir,
    wait_for,
)
from tests.support.etcd_fixtures import etcd_cluster  # noqa: F401 - the fixture the etcd daemons use
from tests.support.held_release import ProxyThread
from tests.support.kube_fixtures import kube  # noqa: F401 - the fixture the kubernetes ones use
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.slow

PERIOD = 2.5
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
BACKENDS = [
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.postgres),
    pytest.param("postgresql+advisory", marks=pytest.mark.postgres),
    "etcd",
    pytest.param("kubernetes", marks=pytest.mark.kubernetes),
]


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

    def start(self, *node_ids: str, extra: tuple[str, ...] = ()) -> list[Daemon]:
        """Start the daemons together; each ready before this returns."""
        started = [
            Daemon(node_id, self.backend, workdir=self.workdir, ttl=TTL,
                   extra_args=("--once-per", f"{self.period:g}s", "--kill-grace", "0.3", *extra),
                   command=self.command).start()
            for node_id in node_ids
        ]  # fmt: skip
        for d in started:
            d.wait_ready()
        self.daemons += started
        return started

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

    def until_runs(self, count: int, timeout: float | None = None) -> list[Run]:
        runs: list[Run] = wait_for(lambda: len(self.runs()) >= count and self.runs(),
                                   timeout=timeout or 4 * self.period + 5 * TTL,
                                   what=f"{count} runs")  # fmt: skip
        return runs

    def fresh_run(self) -> Run:
        """The newest run, once it started less than half a period ago: mid-period now."""

        def fresh() -> Run | None:
            runs = self.runs()
            young = runs and time.time() - runs[-1].at < self.period / 2
            return runs[-1] if young else None

        run: Run = wait_for(fresh, timeout=4 * self.period, what="a run just started")
        return run

    def stop(self, d: Daemon, signum: int) -> None:
        d.signal(signum)
        if signum == signal.SIGTERM:
            assert d.wait() == 0
        else:
            d.wait()
        self.daemons.remove(d)


def _backend_url(request: pytest.FixtureRequest, workdir: str) -> Iterator[str]:
    name = request.param
    if name == "sqlite":
        yield f"sqlite://{workdir}/lease.db"
    elif name == "etcd":
        yield str(
            request.getfixturevalue("etcd_cluster").url(prefix=f"/once-{uuid.uuid4().hex[:8]}/")
        )
    elif name == "kubernetes":
        kubeconfig = request.getfixturevalue("kube").restricted.kubeconfig(f"{workdir}/kubeconfig")
        yield f"kubernetes:///leaderd-test?lease-prefix=o{uuid.uuid4().hex[:8]}-&kubeconfig={kubeconfig}"
    else:
        pg: PgServer = request.getfixturevalue("pg_server")
        table = f"once_{uuid.uuid4().hex[:8]}"
        yield pg.dsn(scheme=name, table=table)
        tables = ", ".join(f"{table}{s}" for s in ("", "_members", "_history", "_jobs"))
        pg.psql(f"DROP TABLE IF EXISTS {tables}")
        pg.psql(f"DROP FUNCTION IF EXISTS {table}_fence(text, bigint)")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    workdir = short_tempdir("ld-op-")
    request.node.workdir = workdir
    yield from _backend_url(request, workdir)
    shutil.rmtree(workdir, ignore_errors=True)


def last_run(d: Daemon) -> dict[str, Any]:
    job: dict[str, Any] = d.get("/jobs")[1]["jobs"][0]
    return job


def assert_once_per_period(runs: list[Run], period: float = PERIOD) -> None:
    """Every recorded run ran once, in order, a period apart."""
    assert [r.run for r in runs] == list(range(1, len(runs) + 1)), runs
    gaps = [b.at - a.at for a, b in itertools.pairwise(runs)]
    assert all(gap >= period - STAMP_JITTER for gap in gaps), (gaps, runs)


def test_a_failover_in_mid_period_does_not_run_the_job_again(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """A graceful hand-over, then a crash, each in mid-period (three nodes, so a standby is
    left for the crash: a run of two nodes would repeat the first half of this one)."""
    cluster = Cluster(request.node.workdir, backend)
    cluster.start("node-a", "node-b", "node-c")
    first = cluster.fresh_run()  # a period begins
    old = cluster.leader()
    assert old.node_id == first.node
    cluster.stop(old, signal.SIGTERM)  # a graceful hand-over, just after the run: mid-period
    successor = cluster.leader()
    # Released, not waited out: the job's writes of the record never cost the release.
    released = (first.term, old.node_id, "released")
    wait_for(lambda: released in history(successor, 3), timeout=10, what=f"{released}")
    second = cluster.until_runs(first.run + 1)[first.run]
    assert second.node == successor.node_id and second.term > first.term
    cluster.stop(successor, signal.SIGKILL)  # a crash in mid-period: taken over after a ttl
    last = cluster.until_runs(first.run + 2)[first.run + 1]
    assert last.node == cluster.leader().node_id and last.term > second.term
    # The last run's end is recorded: no other run came meanwhile.
    wait_for(lambda: last_run(cluster.leader())["status"] == "succeeded", timeout=10,
             what="the last run recorded succeeded")  # fmt: skip
    runs = cluster.runs()
    assert runs[-1] == last, runs
    assert_once_per_period(runs)
    jobs = last_run(cluster.leader())
    assert (jobs["runs"], jobs["exit_code"]) == (last.run, 0)


def test_a_job_running_when_leadership_is_lost_is_stopped_and_not_run_again(
    backend: str, request: pytest.FixtureRequest
) -> None:
    cluster = Cluster(request.node.workdir, backend, job_seconds=60, period=3.0)
    cluster.start("node-a", "node-b")
    a = cluster.leader()
    (b,) = (d for d in cluster.daemons if d is not a)
    first = cluster.until_runs(1)[0]
    assert first.node == a.node_id
    assert a.post("/resign?cooldown=60")[0] == 200  # the job still runs
    # Eventually (a release a loaded host let time out is waited out: two ttls and a round).
    wait_for(lambda: b.is_leader(), timeout=30, what=f"{b.node_id} to lead")
    jobs = wait_for(lambda: last_run(a)["status"] == "stopped" and last_run(a), timeout=10,
                    what="the run recorded stopped")  # fmt: skip
    assert jobs["runs"] == 1 and jobs["started_by"] == a.node_id
    assert "stopping child" in a.log()
    second = cluster.until_runs(2)[1]  # the new leader waits for the period to end
    assert second.node == b.node_id
    assert_once_per_period(cluster.runs(), cluster.period)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("catch_up", [True, False], ids=["catch-up", "schedule"])
def test_after_an_outage_the_job_runs_once_at_once_or_at_the_schedules_next_point(
    backend: str, catch_up: bool, request: pytest.FixtureRequest
) -> None:
    period = 1.5
    cluster = Cluster(request.node.workdir, backend, period=period)
    cluster.start("node-a", "node-b", extra=("--catch-up",) if catch_up else ())
    first = cluster.fresh_run()
    leader = cluster.leader()
    (standby,) = (d for d in cluster.daemons if d is not leader)
    frozen_outside_a_write(standby)  # it cannot take over: an outage with no leader
    cluster.stop(leader, signal.SIGTERM)
    # Two periods pass with no start; the schedule's next point would be first.at + 3 periods.
    time.sleep(max(0.0, first.at + 2.2 * period - time.time()))
    standby.signal(signal.SIGCONT)
    caught_up = cluster.until_runs(first.run + 1)[first.run]
    assert caught_up.node == standby.node_id
    late = caught_up.at - first.at
    if catch_up:
        # At once, not at the schedule's next point: judged by the runner's reason, which a
        # loaded host cannot blur, as it can the start's time.
        assert late > 2 * period, late
        assert "period(s) missed, running it at once (--catch-up)" in standby.log()
    else:
        assert "running it at once" not in standby.log()
        assert late >= 3 * period - STAMP_JITTER, late
    cluster.until_runs(first.run + 2)
    assert_once_per_period(cluster.runs(), period)  # once: the next run is a period later


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--once-per", "1h", "--backend", "static://", "--", "true"],
         "--once-per records its runs in the backend: static:// keeps no record"),
        (["--once-per", "1h"], "--once-per goes with -- COMMAND"),
        (["--catch-up", "--", "true"], "--catch-up goes with --once-per"),
        (["--once-per", "0s", "--", "true"], "is no duration > 0"),
    ],
)  # fmt: skip
def test_once_per_misuse_is_refused_at_start(args: list[str], says: str, tmp_path: Path) -> None:
    done = leaderd_cli("run", "--socket", str(tmp_path / "s.sock"), *args)
    assert done.returncode == 2 and says in done.stderr, done.stderr


@pytest.mark.postgres
def test_a_backend_down_at_start_is_waited_for_and_the_job_runs_once_it_answers(
    pg_server: PgServer,
) -> None:
    """The record's store cannot open while the server is unreachable: the daemon waits, as
    its elections do, instead of exiting (two daemons that lost the race to create the
    table exited so, and left no standby)."""
    workdir = short_tempdir("ld-op-")
    proxied = ProxyThread(pg_server.host, pg_server.port)
    try:
        proxied.blackhole()
        url = pg_server.dsn(table=f"down_{uuid.uuid4().hex[:8]}", connect_timeout="1")
        url = url.replace(f":{pg_server.port}/", f":{proxied.proxy.port}/")
        cluster = Cluster(workdir, url)
        (d,) = [Daemon("node-a", url, workdir=workdir, ttl=TTL, command=cluster.command,
                       extra_args=("--once-per", f"{PERIOD:g}s")).start()]  # fmt: skip
        said = "cannot open the record of run --once-per yet"
        wait_for(lambda: said in d.log() or not d.alive(), timeout=30, what="the store's failure")
        assert d.alive(), d.log()
        proxied.heal()
        (run,) = wait_for(cluster.runs, timeout=30, what="the first run")
        assert run.node == "node-a" and d.alive()
    finally:
        proxied.close()
        shutil.rmtree(workdir, ignore_errors=True)
