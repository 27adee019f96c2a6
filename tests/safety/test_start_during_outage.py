"""Issue 16: a daemon started while its database is down is ready (READY=1, /ready 200)
after its first attempt, answers "unknown", and leads once the database is back."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.support.daemons import Daemon, short_tempdir, wait_for
from tests.support.pgserver import PgServer


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir()
    yield path
    subprocess.run(["rm", "-rf", path], check=False)


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+advisory"])
def test_a_daemon_started_during_an_outage_is_ready_and_unknown(
    pg: PgServer, workdir: str, scheme: str
) -> None:
    notify_path = os.path.join(workdir, "notify.sock")
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(notify_path)
    sink.settimeout(15)
    url = pg.dsn(scheme=scheme, table=f"outage_{uuid.uuid4().hex[:8]}", connect_timeout="1")
    pg.stop()
    d = Daemon("outage", url, workdir=workdir, env={"NOTIFY_SOCKET": notify_path}).start()
    started = time.monotonic()
    while "READY=1" not in (message := sink.recv(4096).decode()):
        pass
    # The first attempt gives up within one request timeout (renew_interval, connect_timeout).
    assert time.monotonic() - started < 10, "READY=1 waited for the database"
    assert "STATUS=default: unknown" in message, message
    assert d.get("/ready")[0] == 200
    code, body = d.get("/leader")
    assert (code, body["role"], body["leader"]) == (503, "unknown", None)
    pg.start()
    wait_for(lambda: d.is_leader(), 30, what="a leader once the database is back")
    assert d.stop() == 0
    sink.close()
