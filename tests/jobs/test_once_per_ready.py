"""A `run --once-per` daemon is ready once its job's record can be kept, not before.

Its elections may finish their first round while the record's store still opens: a
Kubernetes readiness probe or systemd's READY=1 then reported a node that could not yet
record (and so not yet run) its job. Forced on the suite's PostgreSQL: another session
creates the jobs table and keeps its transaction open, so the daemon's CREATE TABLE IF NOT
EXISTS waits for it while the lease table, already there, serves the election.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import pytest

from tests.support.daemons import Daemon, short_tempdir, wait_for
from tests.support.pgserver import PgServer

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

JOB = "import sys; open(sys.argv[1], 'a').write('ran\\n')"
HOLDER_APP = "leaderd-test-holds-create"


def _hold_the_jobs_table(pg: PgServer, table: str) -> subprocess.Popen[bytes]:
    """A session that creates ``table`` and does not commit (until terminated)."""
    sql = f'BEGIN; CREATE TABLE "public"."{table}" (held int); SELECT pg_sleep(120);'
    argv = [str(pg.bindir / "psql"), "-h", str(pg.sockdir), "-p", str(pg.port), "-U", "postgres",
            "-d", "postgres", "-AtX", "-c", sql]  # fmt: skip
    env = {**os.environ, "PGAPPNAME": HOLDER_APP}
    holder = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    held = (
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
        f"WHERE a.application_name = '{HOLDER_APP}' AND l.mode = 'AccessExclusiveLock'"
    )
    wait_for(lambda: pg.psql(held) != "0", timeout=15, what="the held CREATE TABLE")
    return holder


def test_ready_waits_for_the_record_of_run_once_per(pg_server: PgServer) -> None:
    workdir = short_tempdir("ld-opr-")
    table = f"ready_{uuid.uuid4().hex[:8]}"
    url = pg_server.dsn(table=table)
    runs = os.path.join(workdir, "runs")
    holder = _hold_the_jobs_table(pg_server, f"{table}_jobs")
    job = [sys.executable, "-c", JOB, runs]
    daemon = Daemon("node-a", url, workdir=workdir, ttl=2.0, command=job,
                    extra_args=("--once-per", "60s"))  # fmt: skip
    try:
        daemon.start()
        wait_for(lambda: daemon.is_leader(), timeout=30, what="the lease")
        code, body = daemon.get("/ready")
        assert code == 503, (code, body)
        assert body["error"]["message"] == "still opening the record of run --once-per"
        assert not os.path.exists(runs), "the job ran with no record of its start"
        pg_server.psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE application_name = '{HOLDER_APP}'"
        )
        wait_for(lambda: daemon.get("/ready")[0] == 200, timeout=30, what="/ready")
        wait_for(lambda: os.path.exists(runs), timeout=30, what="the first run")
    finally:
        holder.kill()
        holder.wait()
        daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)
