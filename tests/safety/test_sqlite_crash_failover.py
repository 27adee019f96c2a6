"""sqlite:// crash failover on real daemons, with the referee judging every /leader answer:
a SIGKILLed holder's lease goes at once, on the kernel's proof of its death only; a frozen
holder, a holder whose `run --` command lives on, or a lock file replaced or deleted under
the daemons leave the one-ttl rule in force (docs/algorithm.md, "Crash failover on one host").

A ttl of 60 s makes every early takeover causal: within a few seconds only the proof can
explain a new leader, and only the ttl rule's wait can explain none."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from tests.support.daemons import (
    Daemon,
    end_of,
    frozen_outside_a_write,
    leaders,
    short_tempdir,
    wait_for,
)
from tests.support.holder_lock import break_holder_lock
from tests.support.referee import Referee

LONG = {"ttl": 60.0, "renew_interval": 1.0, "retry_interval": 0.25}
SHORT = {"ttl": 3.0, "renew_interval": 1.0, "retry_interval": 0.25}
EARLY = 10.0  # well under the 60 s ttl: a takeover by then is the proof's doing


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir()
    yield path
    subprocess.run(["rm", "-rf", path], check=False)


def started(names: str, workdir: str, **options: object) -> list[Daemon]:
    db = f"sqlite://{workdir}/lease.db"
    daemons = []
    for name in names:
        daemon = Daemon(name, db, workdir=workdir, **{**LONG, **options}).start()  # type: ignore[arg-type]
        daemon.wait_ready()
        daemons.append(daemon)
    return daemons


def term_of(daemon: Daemon) -> int:
    return int(daemon.get("/leader")[1]["term"])


def nobody_else_leads(others: list[Daemon], seconds: float) -> None:
    for _ in range(round(seconds / 0.1)):
        assert leaders(others) == []
        time.sleep(0.1)


def test_a_sigkilled_holders_standby_leads_without_waiting_out_the_ttl(workdir: str) -> None:
    a = started("a", workdir)[0]
    wait_for(a.is_leader, 10, what="a to lead")
    b, c = started("bc", workdir)
    term = term_of(a)
    with Referee([a, b, c]):
        a.kill()  # SIGKILL: no release, its lease has ~60 s left
        new = wait_for(lambda: leaders([b, c]), EARLY, what="a standby to lead")[0]
        assert term_of(new) == term + 1
    assert end_of(new, term) == (term, "a", "holder died")


def test_a_frozen_holder_keeps_its_lease(workdir: str) -> None:
    a = started("a", workdir)[0]
    wait_for(a.is_leader, 10, what="a to lead")
    (b,) = started("b", workdir)
    term = term_of(a)
    with Referee([a, b]):
        frozen_outside_a_write(a)  # not inside its own write, which would hold b off anyway
        try:
            nobody_else_leads([b], 4.0)  # b's rounds (every 0.25 s) find the lock held
        finally:
            a.signal(signal.SIGCONT)
        wait_for(a.is_leader, 10, what="a to lead again")
        assert term_of(a) == term
        assert not b.is_leader()


def tree_of(pid: int) -> list[list[int]]:
    """The processes below ``pid`` by depth: [children, grandchildren, ...] (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        with suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    levels, level = [], [pid]
    while level := [p for p, parent in parents.items() if parent in level]:
        levels.append(level)
    return levels


def alive(pid: int) -> bool:
    with suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    return False


def test_a_sigkilled_daemon_whose_command_lives_on_is_waited_out(workdir: str) -> None:
    a = started("a", workdir, command=["sleep", "600"])[0]
    wait_for(a.is_leader, 10, what="a to lead")
    # leaderd -> keeper -> guard -> command: wait until the command runs.
    levels = wait_for(lambda: (t := tree_of(a.pid)) and len(t) >= 3 and t, 10, what="the tree")
    keeper_and_guard, command = levels[0] + levels[1], [p for lv in levels[2:] for p in lv]
    (b,) = started("b", workdir)
    try:
        with Referee([a, b]):
            for pid in keeper_and_guard:  # they would kill the tree the instant leaderd dies
                os.kill(pid, signal.SIGSTOP)
            os.kill(a.pid, signal.SIGKILL)  # leaderd alone: its command runs on
            a.wait()
            nobody_else_leads([b], 4.0)
            assert all(alive(pid) for pid in command)  # it did live on all that time
    finally:
        for pid in keeper_and_guard + command:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["replaced", "deleted"])
def test_a_lock_file_replaced_or_deleted_under_the_daemons_leaves_the_ttl_rule(
    workdir: str, how: str
) -> None:
    a = started("a", workdir, **SHORT)[0]
    wait_for(a.is_leader, 10, what="a to lead")
    break_holder_lock(Path(workdir) / "lease.db", how)
    (c,) = started("c", workdir, **SHORT)  # locks the new file, which nobody holds
    term = term_of(a)
    with Referee([a, c]):
        nobody_else_leads([c], 2.0)
        assert a.is_leader()
        a.kill()
        wait_for(lambda: c.is_leader(), 3 * SHORT["ttl"], what="c to lead by the ttl rule")
    assert end_of(c, term) == (term, "a", "taken over after expiry")
