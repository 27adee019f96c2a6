"""A stopping leader's log lines wait for its release's answer (leaderd/held_logs.py), so
that they cost the hand-over nothing; a release that hangs must not hide them."""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.daemons import Daemon, short_tempdir, wait_for

# A release bounded by the renew interval, and a busy timeout past it: it waits for the lock.
TTL, RENEW, BUSY_MS = 30.0, 10.0, 20_000
STOP_LINES = ("received SIGTERM: handing over", "stepping down from election default",
              "released election default", "exiting")  # fmt: skip


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir()
    yield path
    subprocess.run(["rm", "-rf", path], check=False)


def test_the_stop_is_logged_while_the_release_hangs_and_in_order_after(workdir: str) -> None:
    """Another process holds the SQLite file's write lock, so the release waits for it.
    The lines of the signal and of stepping down must be written meanwhile; then, with
    the lock let go, the release's own line and the exit follow, in order."""
    path = f"{workdir}/lease.db"
    d = Daemon("held", f"sqlite://{path}?busy_timeout_ms={BUSY_MS}", workdir=workdir,
               ttl=TTL, renew_interval=RENEW, retry_interval=1.0).start()  # fmt: skip
    try:
        d.wait_ready()
        wait_for(d.is_leader, timeout=10, what="leadership")
        writer = sqlite3.connect(path, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")  # the write lock: the release must wait for it
        try:
            d.signal(signal.SIGTERM)
            wait_for(lambda: STOP_LINES[1] in d.log(), timeout=RENEW / 2, what="stepping down")
            pending = d.log()
            assert "released election" not in pending and "could not release" not in pending
        finally:
            writer.execute("ROLLBACK")
            writer.close()
        assert d.wait() == 0, d.log()
    finally:
        d.kill()
    lines = d.log().splitlines()
    found = [next(i for i, line in enumerate(lines) if text in line) for text in STOP_LINES]
    assert found == sorted(found), lines
    times = [re.match(r"\S+", lines[i]).group() for i in found]  # type: ignore[union-attr]
    assert times == sorted(times), lines
