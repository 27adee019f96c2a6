"""Hand-over to a chosen standby on three real SQLite daemons (tests/support/switchover.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.support.daemons import Daemon, short_tempdir
from tests.support.switchover import (
    fails_over_after_one_ttl_when_the_chosen_standby_is_stopped,
    hands_over_to_the_chosen_standby,
    plain_resign_on_a_follower_changes_nothing,
    refuses_a_standby_not_heard_within_a_renew_interval,
    refuses_a_standby_that_stopped,
    reports_a_lapsed_reservation,
    resign_to,
    the_leader,
)

TTL = 2.0
RENEW_INTERVAL = 0.5  # tests.support.daemons.Daemon's default
LONG_TTL = 8.0


def three_daemons(ttl: float) -> Iterator[list[Daemon]]:
    workdir = short_tempdir()
    daemons = [Daemon(f"node-{i}", f"sqlite://{workdir}/lease.db", workdir=workdir, ttl=ttl)
               for i in range(3)]  # fmt: skip
    try:
        for d in daemons:
            d.start().wait_ready()
        yield daemons
    finally:
        for d in daemons:
            d.kill()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def trio() -> Iterator[list[Daemon]]:
    yield from three_daemons(TTL)


@pytest.fixture
def long_ttl_trio() -> Iterator[list[Daemon]]:
    """A ttl of many renew intervals: a frozen standby stays within it for a while."""
    yield from three_daemons(LONG_TTL)


def test_resign_to_hands_over_to_the_chosen_standby(trio: list[Daemon]) -> None:
    hands_over_to_the_chosen_standby(trio, TTL)


def test_a_stopped_chosen_standby_delays_the_failover_by_one_ttl(trio: list[Daemon]) -> None:
    fails_over_after_one_ttl_when_the_chosen_standby_is_stopped(trio, TTL)


def test_resign_to_from_a_follower_exits_1_and_changes_nothing(trio: list[Daemon]) -> None:
    leader = the_leader(trio, timeout=TTL * 3)
    follower = next(d for d in trio if d is not leader)
    done = resign_to(follower, leader.node_id)
    assert done.returncode == 1 and "does not lead" in done.stderr
    assert the_leader(trio, timeout=1) is leader


def test_resign_to_a_standby_that_stopped_is_refused(trio: list[Daemon]) -> None:
    refuses_a_standby_that_stopped(trio, TTL)


def test_resign_to_reports_a_lapsed_reservation(trio: list[Daemon]) -> None:
    reports_a_lapsed_reservation(trio, TTL)


def test_plain_resign_on_a_follower_exits_1_and_changes_nothing(trio: list[Daemon]) -> None:
    plain_resign_on_a_follower_changes_nothing(trio, TTL)


def test_resign_to_a_standby_silent_for_a_renew_interval_is_refused(
    long_ttl_trio: list[Daemon],
) -> None:
    refuses_a_standby_not_heard_within_a_renew_interval(long_ttl_trio, LONG_TTL, RENEW_INTERVAL)
