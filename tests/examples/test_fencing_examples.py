"""Each fencing example in examples/fencing/ writes while its daemon leads and is refused
once another node does, run as its users would run it (docs/fencing.md). etcd's example
runs in tests/backends/etcd/test_fence.py, on the suite's etcd cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from tests.support.daemons import REPO, Daemon, short_tempdir, wait_for
from tests.support.pgserver import PgServer

FENCING = REPO / "examples" / "fencing"


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pair(backend: str, workdir: str) -> tuple[Daemon, Daemon]:
    """node-a leads, node-b follows."""
    a = Daemon("node-a", backend, workdir=workdir).start()
    a.wait_ready()
    wait_for(a.is_leader, timeout=10, what="node-a to lead")
    b = Daemon("node-b", backend, workdir=workdir).start()
    b.wait_ready()
    return a, b


def hand_over(a: Daemon, b: Daemon) -> None:
    assert a.post("/resign?cooldown=60")[0] == 200
    wait_for(b.is_leader, timeout=10, what="node-b to lead")


def run(args: list[str], daemon: Daemon, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "LEADERD_SOCKET": daemon.socket, **env}
    return subprocess.run(args, env=environment, capture_output=True, text=True, timeout=30,
                          check=False)  # fmt: skip


def test_sqlite_example_writes_while_leading_and_is_refused_after_a_hand_over(
    workdir: str,
) -> None:
    lease = os.path.join(workdir, "lease.db")
    a, b = pair(f"sqlite://{lease}", workdir)
    try:
        example = [sys.executable, str(FENCING / "sqlite_fence.py"), "--lease-file", lease,
                   "--app-db", os.path.join(workdir, "app.db")]  # fmt: skip
        term = a.get("/leader")[1]["term"]
        written = run([*example, "--socket", a.socket, "first"], a)
        assert written.returncode == 0 and f"written with term {term}" in written.stdout
        hand_over(a, b)
        stale = run([*example, "--socket", a.socket, "--term", str(term), "stale"], a)
        assert stale.returncode == 1 and f"not led with term {term}" in stale.stderr
        assert run([*example, "--socket", b.socket, "second"], b).returncode == 0
    finally:
        a.kill()
        b.kill()


@pytest.mark.postgres
def test_postgres_example_writes_while_leading_and_is_refused_after_a_hand_over(
    workdir: str, pg_server: PgServer
) -> None:
    table = f"fence_{uuid.uuid4().hex[:8]}"
    a, b = pair(pg_server.dsn(table=table), workdir)
    example = [str(FENCING / "postgres-fenced-insert.sh")]
    env = {"DATABASE_URL": pg_server.dsn(), "LEADERD_FENCE": f"{table}_fence"}
    try:
        term = a.get("/leader")[1]["term"]
        written = run([*example, "first"], a, **env)
        assert written.returncode == 0, written.stderr
        hand_over(a, b)
        stale = run([*example, "stale"], a, LEADERD_TERM=str(term), **env)
        assert stale.returncode == 1 and "leaderd fence" in stale.stderr, stale.stderr
        assert run([*example, "second"], b, **env).returncode == 0
        notes = pg_server.psql("SELECT note FROM fenced_log ORDER BY term")
        assert notes.split() == ["first", "second"]
        # A follower asking its own daemon gets no term at all.
        assert run([*example, "x"], a, **env).returncode == 1
    finally:
        a.kill()
        b.kill()
        pg_server.psql(
            f"DROP TABLE IF EXISTS fenced_log, {table}, {table}_members, {table}_history"
        )
        pg_server.psql(f"DROP FUNCTION IF EXISTS {table}_fence(text, bigint)")
