"""A SQLite standby leads on the release's commit, not at a retry round of its own.

Daemons started as users start them: default timing, `sqlite:///` followed by an absolute
path (so the file's path begins with "//"), the logs beside the file. The standby's backend
requests are counted on its /metrics: between the release and its leading there must be
none (the grant is read by its waiter, which a commit wakes).
"""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator

import pytest

from tests.support.daemons import Daemon, metric, short_tempdir, wait_for

TTL, RENEW, RETRY = 15.0, 5.0, 2.0  # the defaults
ROUNDS = 'leaderd_backend_request_seconds_count{backend="sqlite",operation="acquire_or_renew"}'


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def started(node_id: str, workdir: str) -> Daemon:
    url = f"sqlite:///{workdir}/h.db"  # the README's "sqlite:///PATH" with PATH absolute
    timing = {"ttl": TTL, "renew_interval": RENEW, "retry_interval": RETRY}
    daemon = Daemon(node_id, url, workdir=workdir, **timing).start()
    daemon.wait_ready()
    return daemon


def follows(daemon: Daemon, leader: str) -> bool:
    body = daemon.get("/leader")[1] or {}
    return body.get("role") == "follower" and (body.get("leader") or {}).get("node_id") == leader


def test_the_granted_standby_leads_on_the_release_commit_without_a_round(workdir: str) -> None:
    leader = started("a", workdir)
    wait_for(leader.is_leader, TTL, what="a to lead")
    standby = started("b", workdir)
    wait_for(lambda: follows(standby, "a"), TTL, what="b to follow a")
    # Release just after one of the standby's rounds: its next is a retry interval away.
    before = metric(standby, ROUNDS)
    wait_for(lambda: metric(standby, ROUNDS) > before, RETRY * 3, what="a round of b")
    rounds = metric(standby, ROUNDS)
    leader.signal(signal.SIGTERM)
    wait_for(standby.is_leader, TTL, what="b to lead")
    assert metric(standby, ROUNDS) == rounds, "b led only after a round of its own"
    assert leader.wait() == 0
    assert "granted term" in standby.log()
