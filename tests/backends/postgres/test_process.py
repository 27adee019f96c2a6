"""Three real daemons on one PostgreSQL server, per backend: real signals, a real restart."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from leaderd.backends.postgres.advisory import advisory_key
from tests.backends.postgres.helpers import unique
from tests.support import switchover
from tests.support.daemons import Daemon, leaders, released_to, short_tempdir, wait_for
from tests.support.pgserver import PASSWORD, PASSWORD_USER, PgServer

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TTL, RENEW, RETRY = 2.0, 0.5, 0.25
LONG_TTL = 36.0  # longer than any wait here: a takeover before it lapses is not the ttl's


@contextlib.contextmanager
def running(url: str, ttl: float = TTL) -> Iterator[list[Daemon]]:
    """Three ready daemons on ``url``; killed (and checked for leaked passwords) after."""
    workdir = short_tempdir()
    daemons = [Daemon(f"node-{i}", url, workdir=workdir, ttl=ttl).start() for i in range(3)]
    try:
        for d in daemons:
            d.wait_ready()
        yield daemons
    finally:
        for d in daemons:
            if d.alive():
                d.signal(signal.SIGCONT)
            d.kill()
        for d in daemons:
            assert PASSWORD not in d.log(), f"{d.node_id} logged the password"
        subprocess.run(["rm", "-rf", workdir], check=False)


@pytest.fixture
def cluster(pg: PgServer, scheme: str) -> Iterator[list[Daemon]]:
    with running(pg.dsn(PASSWORD_USER, PASSWORD, scheme=scheme, table=unique("p"))) as daemons:
        yield daemons


def the_leader(daemons: list[Daemon], timeout: float = TTL + RETRY + 3) -> Daemon:
    found = wait_for(lambda: leaders(daemons), timeout=timeout, what="a leader")
    assert len(found) == 1, [d.node_id for d in found]
    return found[0]


def term_of(d: Daemon) -> int:
    return int(d.get("/leader")[1]["term"])


def test_exactly_one_leader_and_no_password_in_status(cluster: list[Daemon]) -> None:
    leader = the_leader(cluster)
    for _ in range(10):
        assert leaders(cluster) == [leader]
        time.sleep(0.1)
    code, status = leader.get("/status")
    assert code == 200 and PASSWORD not in str(status)


def test_sigterm_hands_over_at_once(cluster: list[Daemon], scheme: str) -> None:
    leader = the_leader(cluster)
    before = term_of(leader)
    followers = [d for d in cluster if d is not leader]
    t0 = time.monotonic()
    leader.signal(signal.SIGTERM)
    new = the_leader(followers)
    took = time.monotonic() - t0
    assert leader.wait() == 0
    print(f"\n{scheme}: SIGTERM -> new leader seen by polling in {took * 1000:.0f} ms")
    released_to(new, leader, before, TTL)


def kill_the_leader(cluster: list[Daemon], what: str) -> float:
    """SIGKILL the leader; seconds until another leads, with the next term."""
    leader = the_leader(cluster)
    before = term_of(leader)
    leader.kill()
    t0 = time.monotonic()
    new = the_leader([d for d in cluster if d is not leader])
    took = time.monotonic() - t0
    print(f"\n{what}: SIGKILL -> new leader in {took * 1000:.0f} ms")
    assert term_of(new) == before + 1
    return took


def test_sigkill_leader_is_replaced(cluster: list[Daemon], scheme: str) -> None:
    # Lease: the row expires. Advisory: the lock passes on when the kernel closes the
    # session, and the successor then waits out the dead holder's lease (takeover=wait).
    assert kill_the_leader(cluster, scheme) <= TTL + RETRY + 1.5


def test_advisory_immediate_takeover_replaces_a_killed_leader_before_its_lease_ends(
    pg: PgServer,
) -> None:
    # The dead holder's lease has LONG_TTL to run: a successor that leads at all within
    # the_leader's wait (a sixth of it) took the lock on the session's end, not the lapse.
    url = pg.dsn(scheme="postgresql+advisory", table=unique("p"), takeover="immediate")
    with running(url, ttl=LONG_TTL) as cluster:
        assert kill_the_leader(cluster, "advisory, takeover=immediate") < LONG_TTL / 6


def test_sigstop_leader_is_replaced_and_says_so_after_sigcont(cluster: list[Daemon]) -> None:
    leader = the_leader(cluster)
    leader.signal(signal.SIGSTOP)
    try:
        new = the_leader([d for d in cluster if d is not leader], timeout=3 * TTL + 3)
    finally:
        leader.signal(signal.SIGCONT)
    assert leader.get("/leader")[0] == 503  # its first answer: not leader
    assert leaders(cluster) == [new]


def test_postgres_restart_keeps_one_leader_and_terms_increase(
    cluster: list[Daemon], pg: PgServer, scheme: str
) -> None:
    # Advisory: the leader hears of its closed lock session at once (the engine waits in
    # wait_for_change while leading too), before a standby can hold the new lock.
    leader = the_leader(cluster)
    before = term_of(leader)
    pg.restart()
    new = the_leader(cluster, timeout=TTL + RETRY + 5)
    assert term_of(new) >= before
    for _ in range(5):
        assert len(leaders(cluster)) == 1
        time.sleep(0.1)


def test_postgres_stopped_leader_steps_down_followers_unknown(
    cluster: list[Daemon], pg: PgServer
) -> None:
    leader = the_leader(cluster)
    pg.stop()
    t0 = time.monotonic()
    wait_for(lambda: not leaders(cluster), timeout=TTL + 1, what="the leader to step down")
    assert time.monotonic() - t0 <= TTL + 0.5

    def all_unknown() -> bool:
        bodies = [d.get("/leader")[1] or {} for d in cluster]
        return all(b.get("role") == "unknown" and b.get("leader") is None for b in bodies)

    wait_for(all_unknown, timeout=2 * TTL + 2, what="every node to report unknown")
    assert leader.alive()


def test_terminated_sessions_keep_one_leader(
    cluster: list[Daemon], pg: PgServer, scheme: str
) -> None:
    leader = the_leader(cluster)
    before = term_of(leader)
    pg.psql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'leaderd' AND pid <> pg_backend_pid() "
        "AND query NOT LIKE 'LISTEN%' AND wait_event IS DISTINCT FROM 'advisory'"
    )
    new = the_leader(cluster, timeout=TTL + RETRY + 3)
    # Lease: the row survives. Advisory: the leader's new session may claim its own row again
    # while its lease lasts (a renewal, the same term); any other holder has a new term.
    assert term_of(new) > before if new is not leader else term_of(new) >= before


def test_an_advisory_keepalive_in_doubt_is_unknown_with_its_error(pg: PgServer) -> None:
    """The leader's lock session hangs on the server: its keepalives time out. That is a
    failure the leader reports (role unknown once its deadline passed, the error kept),
    not a "nobody holds it" answer; nobody else leads while the lock may still be held."""
    key = advisory_key("default")
    url = pg.dsn(scheme="postgresql+advisory", table=unique("p"))
    with running(url) as cluster:
        leader = the_leader(cluster)
        before = term_of(leader)
        pid = int(
            pg.psql(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid "
                f"= 1 AND ((classid::int8 << 32) | objid::int8) = {key}"
            )
        )
        os.kill(pid, signal.SIGSTOP)
        try:

            def unknown_after_a_timeout() -> bool:
                """One /status answer shows both: the role unknown, with no leader named,
                and the keepalive's timeout as the backend's error (the backend's or the
                engine's). Two requests could fall either side of the keepalive's end."""
                status = leader.get("/status")[1] or {}
                election = status.get("elections", {}).get("default", {})
                error = status.get("backend", {}).get("last_error") or ""
                unknown = election.get("role") == "unknown" and election.get("leader") is None
                return unknown and "timed out" in error

            wait_for(unknown_after_a_timeout, TTL + 2, what="unknown, with the timeout kept")
            assert not leaders(cluster)
        finally:
            os.kill(pid, signal.SIGCONT)
        new = the_leader(cluster, timeout=3 * TTL + 3)
        assert term_of(new) > before if new is not leader else term_of(new) >= before


def test_resign_to_hands_over_to_the_chosen_standby(cluster: list[Daemon]) -> None:
    switchover.hands_over_to_the_chosen_standby(cluster, TTL)


def test_a_stopped_chosen_standby_delays_the_failover_by_one_ttl(cluster: list[Daemon]) -> None:
    switchover.fails_over_after_one_ttl_when_the_chosen_standby_is_stopped(cluster, TTL)


def test_resign_to_a_standby_that_stopped_is_refused(cluster: list[Daemon]) -> None:
    switchover.refuses_a_standby_that_stopped(cluster, TTL)


def lease_cluster(pg: PgServer) -> contextlib.AbstractContextManager[list[Daemon]]:
    return running(pg.dsn(PASSWORD_USER, PASSWORD, scheme="postgresql", table=unique("g")))


def test_sigterm_grants_the_lease_to_a_standby_that_leads_without_a_write(pg: PgServer) -> None:
    with lease_cluster(pg) as daemons:
        switchover.sigterm_grants_the_lease(daemons, TTL)


def test_a_frozen_heir_is_taken_over_within_a_ttl_and_never_leads_after_sigcont(
    pg: PgServer,
) -> None:
    with lease_cluster(pg) as daemons:
        switchover.frozen_heir_is_taken_over(
            daemons, TTL, 2 * RETRY, 3 * TTL + 1, "taken over after expiry"
        )
