"""A release held until after the next round, on SQLite (docs/sqlite.md, "A release that lands
late"): the test holds the file's write lock with its own sqlite3 connection while the leader
resigns, so the release waits in the connection's thread well past the moment the engine
gives up on it; the lock is freed once the engine has campaigned again."""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.daemons import Daemon, short_tempdir, wait_for
from tests.support.referee import Referee

TTL, RENEW = 2.0, 0.5
# The lock is held until the engine gave up on its release and then failed one more round.
GAVE_UP = "could not release election default"
ROUND_FAILED = "election default: backend request failed"


@pytest.fixture
def pair() -> Iterator[tuple[str, Daemon, Daemon]]:
    workdir = short_tempdir()
    db = f"sqlite://{workdir}/lease.db"
    a = Daemon("node-a", db, workdir=workdir, ttl=TTL, renew_interval=RENEW).start()
    b = Daemon("node-b", db, workdir=workdir, ttl=TTL, renew_interval=RENEW)
    try:
        a.wait_ready()
        wait_for(a.is_leader, timeout=10, what="node-a to lead")
        b.start().wait_ready()
        wait_for(lambda: b.get("/leader")[1]["leader"], timeout=10, what="node-b to follow")
        yield f"{workdir}/lease.db", a, b
    finally:
        for d in (a, b):
            d.kill()
        subprocess.run(["rm", "-rf", workdir], check=False)


def test_a_release_queued_behind_a_held_write_lock_leaves_one_leader(
    pair: tuple[str, Daemon, Daemon],
) -> None:
    path, a, b = pair
    term = a.get("/leader")[1]["term"]
    writer = sqlite3.connect(path, isolation_level=None, timeout=30)
    with Referee([a, b]) as referee:
        writer.execute("BEGIN IMMEDIATE")  # the file's write lock: every write waits
        try:
            assert a.post("/resign?cooldown=0")[0] == 200
            # The lock is held: the release queues and the engine gives up on it...
            gave_up = wait_for(lambda: a.log().find(GAVE_UP) + 1, 15, what="the release given up")
            # ...then campaigns again, its request queued behind the same lock.
            wait_for(lambda: ROUND_FAILED in a.log()[gave_up:], 15, what="a round after it")
        finally:
            writer.execute("ROLLBACK")
            writer.close()
        # Whoever leads next (node-b, or node-a on a free lease) leads with a new term.
        wait_for(lambda: max(referee.terms, default=0) > term, timeout=TTL * 3, what="a new term")
    assert term not in referee.terms[referee.terms.index(max(referee.terms)) :]
