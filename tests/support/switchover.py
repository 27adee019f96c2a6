"""Hand-over to a chosen standby (POST /resign?to=NODE), checked on three real daemons.

Shared by the process tests of every backend (SQLite, PostgreSQL lease and advisory, etcd):
a referee polls every daemon's /leader throughout and judges the answers for overlaps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from tests.support.daemons import (
    REPO,
    Daemon,
    frozen_outside_a_write,
    history,
    leaders,
    only_leader_for,
    wait_for,
)
from tests.support.referee import Referee


def the_leader(daemons: Sequence[Daemon], timeout: float) -> Daemon:
    found: list[Daemon] = wait_for(lambda: leaders(daemons), timeout=timeout, what="a leader")
    assert len(found) == 1, [d.node_id for d in found]
    return found[0]


def term_of(d: Daemon) -> int:
    return int(d.get("/leader")[1]["term"])


# Within every suite's renew_interval (0.5 s): the leader accepts resign?to= a standby heard
# within one renew interval; on a loaded host a heartbeat may come late.
FRESH_MS = 400


def listed_as_standby(leader: Daemon, node_id: str, ttl: float) -> None:
    """Wait until the leader's GET /members shows ``node_id`` as a live standby heard
    within FRESH_MS: only then does it accept resign?to= that node."""

    def listed() -> bool:
        members = leader.get("/members")[1].get("members", [])
        return any(m["node_id"] == node_id and m["role"] == "standby"
                   and m["age_ms"] < FRESH_MS for m in members)  # fmt: skip

    wait_for(listed, timeout=ttl * 3, what=f"{node_id} listed as a standby")


def resign_to(leader: Daemon, to: str, *options: str) -> subprocess.CompletedProcess[str]:
    """`leaderd resign --to NODE`, as an operator types it."""
    command = [sys.executable, "-m", "leaderd", "resign", "--socket", leader.socket, "--to", to,
               *options]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=30)


def hands_over_to_the_chosen_standby(daemons: Sequence[Daemon], ttl: float) -> None:
    """Only the chosen standby leads after the hand-over, at once, with the next term; the
    third daemon never leads meanwhile."""
    leader = the_leader(daemons, timeout=ttl * 3)
    before = term_of(leader)
    third, chosen = [d for d in daemons if d is not leader]
    listed_as_standby(leader, chosen.node_id, ttl)
    with Referee(daemons) as referee:
        done = resign_to(leader, chosen.node_id)
        assert done.returncode == 0, done.stderr
        # It returns once the chosen standby leads, and says so.
        told = f"handed election default over to {chosen.node_id}, term {before + 1}"
        assert done.stdout.strip() == told, done.stdout
        assert the_leader(daemons, timeout=ttl) is chosen
        time.sleep(ttl)  # the reservation's whole length: nobody else may lead in it
    after = {(c.node, c.term) for c in referee.claims if c.term > before}
    assert after == {(chosen.node_id, before + 1)}, after
    wait_for(lambda: "handed election default over to " + chosen.node_id in leader.log(), 5)
    assert third.node_id not in {c.node for c in referee.claims}
    switched = (before, leader.node_id, f"handed over to {chosen.node_id}")
    wait_for(lambda: history(chosen, 2)[1:] == [switched], ttl, what="the switchover's record")


def renewed_twice(leader: Daemon) -> None:
    """Wait until ``leader`` renewed twice (its own heartbeat in GET /members moved): the
    second renewal was sent after anything that happened before this call."""

    def heard() -> str | None:
        members = leader.get("/members")[1]["members"]
        at: str | None = next(m["last_heard_at"] for m in members if m["node_id"] == leader.node_id)
        return at

    for _ in range(2):
        last = heard()
        wait_for(lambda: heard() != last, 30, what=f"{leader.node_id} renewing")  # noqa: B023


def refuses_a_standby_that_stopped(daemons: Sequence[Daemon], ttl: float) -> None:
    """A standby stopped gracefully leaves the live members in its last write: after the
    leader's next renewal, resign --to it is refused (well within the ttl it used to stay
    listed for) and the leader keeps leading."""
    leader = the_leader(daemons, timeout=ttl * 3)
    chosen = next(d for d in daemons if d is not leader)
    listed_as_standby(leader, chosen.node_id, ttl)
    assert chosen.stop() == 0
    renewed_twice(leader)
    done = resign_to(leader, chosen.node_id)
    assert done.returncode == 1, done
    refused = f"{chosen.node_id} has stopped or is not a member (election default"
    if "leaving the members failed" in chosen.log():  # a loaded host: its stop is brief
        refused = f"{chosen.node_id} was last heard"
    assert refused in done.stderr, done.stderr
    assert leader.is_leader()


def refuses_a_standby_not_heard_within_a_renew_interval(
    daemons: Sequence[Daemon], ttl: float, renew_interval: float
) -> None:
    """A frozen standby is still within its ttl, but once the leader renewed more than a
    renew interval after its last heartbeat, resign --to it is refused."""
    leader = the_leader(daemons, timeout=ttl * 3)
    chosen = next(d for d in daemons if d is not leader)
    listed_as_standby(leader, chosen.node_id, ttl)
    frozen_outside_a_write(chosen)
    try:
        time.sleep(renew_interval)  # a lower bound: its last heartbeat is older than this
        renewed_twice(leader)
        done = resign_to(leader, chosen.node_id)
    finally:
        chosen.signal(signal.SIGCONT)
    assert done.returncode == 1, done
    assert f"{chosen.node_id} was last heard " in done.stderr, done.stderr
    assert leader.is_leader()


def reports_a_lapsed_reservation(daemons: Sequence[Daemon], ttl: float) -> None:
    """The chosen standby is live but cooling down (it does not ask for the lease): resign
    --to it waits, then exits 1 naming the node that took the election once the reservation
    lapsed."""
    leader = the_leader(daemons, timeout=ttl * 3)
    chosen = next(d for d in daemons if d is not leader)
    assert chosen.post(f"/resign?cooldown={ttl * 5}")[0] == 200  # a follower given a cooldown
    listed_as_standby(leader, chosen.node_id, ttl)
    done = resign_to(leader, chosen.node_id, "--timeout", str(ttl * 4))
    assert done.returncode == 1, done
    assert f"{chosen.node_id} did not take election default: " in done.stderr, done.stderr
    assert "(the reservation lapsed)" in done.stderr, done.stderr


def plain_resign_on_a_follower_changes_nothing(daemons: Sequence[Daemon], ttl: float) -> None:
    """`leaderd resign` on a follower exits 1, says this node does not lead, and leaves its
    cooldown alone: its status revision does not move."""
    leader = the_leader(daemons, timeout=ttl * 3)
    follower = next(d for d in daemons if d is not leader)
    revision = follower.get("/leader")[1]["revision"]
    done = subprocess.run(
        [sys.executable, "-m", "leaderd", "resign", "--socket", follower.socket],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 1, done
    assert "does not lead election default" in done.stderr and "nothing to resign" in done.stderr
    assert follower.get("/leader")[1]["revision"] == revision
    assert leader.is_leader()


def fails_over_after_one_ttl_when_the_chosen_standby_is_stopped(
    daemons: Sequence[Daemon], ttl: float
) -> None:
    """The chosen standby is SIGSTOPped: nobody leads until its reservation has lasted one
    ttl, then another daemon leads with the next term; the old leader says why."""
    leader = the_leader(daemons, timeout=ttl * 3)
    before = term_of(leader)
    third, chosen = [d for d in daemons if d is not leader]
    listed_as_standby(leader, chosen.node_id, ttl)
    frozen_outside_a_write(chosen)
    try:
        with Referee([leader, third]) as referee:
            asked = time.monotonic()
            code, _ = leader.post(f"/resign?to={chosen.node_id}")
            assert code == 200
            new = the_leader([leader, third], timeout=ttl * 4)
            # The referee polls on its own thread: let it see the new term too.
            new_term = lambda: any(c.term > before for c in referee.claims)  # noqa: E731
            wait_for(new_term, timeout=ttl, what="the referee seeing the new leader")
        first = min((c for c in referee.claims if c.term > before), key=lambda c: c.sent)
        # The reservation kept everyone out for one ttl (less the clock-rate bound).
        assert first.received - asked >= ttl * 0.9, first
        assert term_of(new) == before + 1
        wait_for(lambda: f"{chosen.node_id} did not take the lease" in leader.log(), 5)
    finally:
        chosen.signal(signal.SIGCONT)


def sigterm_grants_the_lease(daemons: Sequence[Daemon], ttl: float) -> None:
    """SIGTERM of the leader grants the lease to a standby, which leads with term + 1 and no
    write of its own (docs/algorithm.md, "One-write hand-over"); the history tells it."""
    leader = the_leader(daemons, timeout=ttl * 3)
    before = term_of(leader)
    leader.signal(signal.SIGTERM)
    new = the_leader([d for d in daemons if d is not leader], timeout=ttl * 2)
    assert leader.wait() == 0 and term_of(new) == before + 1
    assert f"granted term {before + 1} by the release" in new.log()
    told = [(before + 1, new.node_id, None), (before, leader.node_id, "released")]
    wait_for(lambda: history(new, 2) == told, timeout=ttl, what="the grant's history")


def frozen_heir_is_taken_over(
    daemons: Sequence[Daemon], ttl: float, settle: float, within: float, end_reason: str
) -> None:
    """The release grants the lease to the only campaigning standby, frozen just after a
    heartbeat: once the grant's lease is gone, the other standby (cooling down meanwhile)
    takes over with term + 2 ``within`` seconds; the thawed heir follows. ``settle``:
    how long the cooling-down standby's next heartbeat takes to say it no longer asks."""
    leader = the_leader(daemons, timeout=ttl * 3)
    before = term_of(leader)
    heir, other = [d for d in daemons if d is not leader]
    assert other.post(f"/resign?cooldown={ttl}")[0] == 200  # not campaigning for one ttl
    time.sleep(settle)
    with Referee(daemons):
        frozen_outside_a_write(heir)
        t0 = time.monotonic()
        leader.signal(signal.SIGTERM)
        assert leader.wait() == 0
        assert the_leader([other], timeout=within) is other
        print(f"\nfrozen heir taken over after {time.monotonic() - t0:.2f}s")
        assert term_of(other) == before + 2  # the grant's term was heir's
        heir.signal(signal.SIGCONT)
        only_leader_for(other, [heir])
    told = (before + 1, heir.node_id, end_reason)
    wait_for(lambda: history(other, 2)[1:] == [told], timeout=ttl, what="the history")
