"""Hand-over to a chosen standby on three real SQLite daemons (tests/switchover.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.daemons import Daemon, short_tempdir
from tests.switchover import (
    fails_over_after_one_ttl_when_the_chosen_standby_is_stopped,
    hands_over_to_the_chosen_standby,
    resign_to,
    the_leader,
)

TTL = 2.0


@pytest.fixture
def trio() -> Iterator[list[Daemon]]:
    workdir = short_tempdir()
    daemons = [Daemon(f"node-{i}", f"sqlite://{workdir}/lease.db", workdir=workdir, ttl=TTL)
               for i in range(3)]  # fmt: skip
    try:
        for d in daemons:
            d.start().wait_ready()
        yield daemons
    finally:
        for d in daemons:
            d.kill()
        shutil.rmtree(workdir, ignore_errors=True)


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
