"""Three real daemons on the 3-member etcd cluster: real signals to daemons and to members.

Every test checks, while its fault lasts, that no two daemons answer "leader" at once
(``Referee``), and that afterwards exactly one leads with a term above every earlier one.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence

import pytest

from tests.support import switchover
from tests.support.daemons import Daemon, leaders, released_to, short_tempdir, wait_for
from tests.support.etcd_cluster import EtcdCluster, Member
from tests.support.referee import Referee

pytestmark = pytest.mark.slow

TTL, RENEW, RETRY = 2.0, 0.5, 0.25
# etcd's lessor looks for expired leases every 500 ms; then the standby's watch wakes it.
LESSOR = 0.5
SLACK = 1.0  # a busy 2-core machine


@contextlib.contextmanager
def running(urls: Sequence[str], ttl: float = TTL) -> Iterator[list[Daemon]]:
    """Three ready daemons, the i-th on ``urls[i % len(urls)]``; killed after."""
    workdir = short_tempdir()
    daemons = [
        Daemon(f"node-{i}", urls[i % len(urls)], workdir=workdir, ttl=ttl).start() for i in range(3)
    ]
    try:
        for d in daemons:
            d.wait_ready()
        yield daemons
    finally:
        for d in daemons:
            d.kill()
        subprocess.run(["rm", "-rf", workdir], check=False)


def prefix() -> str:
    return f"/leaderd-test/{uuid.uuid4().hex[:10]}/"


@pytest.fixture
def trio(etcd: EtcdCluster) -> Iterator[list[Daemon]]:
    with running([etcd.url(prefix=prefix())]) as daemons:
        yield daemons


def the_leader(daemons: Sequence[Daemon], timeout: float = TTL + LESSOR + RETRY + SLACK) -> Daemon:
    found = wait_for(lambda: leaders(daemons), timeout=timeout, what="a leader")
    assert len(found) == 1, [d.node_id for d in found]
    return found[0]


def term_of(d: Daemon) -> int:
    return int(d.get("/leader")[1]["term"])


def leader_key(etcd: EtcdCluster, daemon: Daemon) -> dict[str, object]:
    """The election key as `etcdctl get` shows it (docs/etcd.md)."""
    url_prefix = daemon.backend.split("prefix=", 1)[1].split("&", 1)[0]
    out = etcd.etcdctl("get", f"{url_prefix}default/leader", "--print-value-only")
    value: dict[str, object] = json.loads(out)
    return value


def hand_over(daemons: Sequence[Daemon], signum: int) -> tuple[Daemon, float]:
    """Signal the leader; the next leader (with the next term) and how long it took."""
    leader = the_leader(daemons)
    before = term_of(leader)
    t0 = time.monotonic()
    leader.kill() if signum == signal.SIGKILL else leader.signal(signum)
    new = the_leader([d for d in daemons if d is not leader])
    took = time.monotonic() - t0
    print(f"\netcd: {signal.Signals(signum).name} -> {new.node_id} leads in {took * 1000:.0f} ms")
    assert term_of(new) == before + 1
    if signum == signal.SIGTERM:
        assert leader.wait() == 0
    return new, took


def test_one_leader_and_sigterm_hands_over_at_once(etcd: EtcdCluster, trio: list[Daemon]) -> None:
    leader = the_leader(trio)
    with Referee(trio):
        time.sleep(0.5)
    assert leader_key(etcd, leader)["node_id"] == leader.node_id
    new, _ = hand_over(trio, signal.SIGTERM)
    released_to(new, leader, term_of(new) - 1, TTL)
    key = leader_key(etcd, new)
    assert (key["node_id"], key["term"]) == (new.node_id, term_of(new))


def test_sigkill_failover_within_ttl_and_the_lessors_granularity(trio: list[Daemon]) -> None:
    _, took = hand_over(trio, signal.SIGKILL)
    assert took <= TTL + LESSOR + SLACK


def test_killing_the_raft_leader_member_keeps_one_leader(
    etcd: EtcdCluster, trio: list[Daemon]
) -> None:
    the_leader(trio)
    raft_leader = etcd.wait_healthy()
    with Referee(trio) as referee:
        etcd.kill(raft_leader)
        time.sleep(TTL)
        the_leader(trio)
        etcd.start(raft_leader)
        time.sleep(0.5)
    assert len(referee.terms) >= 1
    the_leader(trio)


def test_a_stopped_member_is_failed_over(etcd: EtcdCluster, trio: list[Daemon]) -> None:
    the_leader(trio)
    first = etcd.members[0]  # every daemon's preferred endpoint
    with Referee(trio):
        etcd.pause(first)
        try:
            time.sleep(2 * TTL)
            the_leader(trio)
        finally:
            etcd.resume(first)
    the_leader(trio)


def test_without_quorum_nobody_leads_and_with_it_again_one_does(
    etcd: EtcdCluster, trio: list[Daemon]
) -> None:
    leader = the_leader(trio)
    before = term_of(leader)
    down: list[Member] = etcd.members[1:]
    with Referee(trio) as referee:
        for member in down:
            etcd.stop(member)
        stopped = time.monotonic()
        wait_for(lambda: not leaders(trio), timeout=TTL + SLACK, what="the leader to step down")
        print(f"\netcd: no quorum -> leader stepped down after {time.monotonic() - stopped:.2f} s")
        assert time.monotonic() - stopped <= TTL + SLACK
        roles = wait_for(
            lambda: {d.get("/leader")[1]["role"] for d in trio} == {"unknown"},
            timeout=TTL + SLACK,
            what="every daemon to say unknown",
        )
        assert roles
        time.sleep(1.0)
        assert not leaders(trio) and all(d.alive() for d in trio)
        for member in down:
            etcd.start(member, wait=False)
        etcd.wait_healthy()
        again = the_leader(trio, timeout=3 * TTL + SLACK)
    assert term_of(again) >= before
    again.signal(signal.SIGTERM)
    assert term_of(the_leader([d for d in trio if d is not again])) > max(referee.terms)


def test_daemons_on_different_members_agree(etcd: EtcdCluster) -> None:
    election_prefix = prefix()
    urls = [etcd.url(prefix=election_prefix, members=[m]) for m in etcd.members]
    with running(urls) as trio, Referee(trio):
        leader = the_leader(trio)
        new, _ = hand_over(trio, signal.SIGTERM)
        released_to(new, leader, term_of(new) - 1, TTL)


def backend_calls(d: Daemon) -> float:
    """Backend requests so far, from /metrics (the histogram's counts)."""
    out = subprocess.run(
        ["curl", "-sS", "--unix-socket", d.socket, "http://localhost/metrics"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in out.stdout.splitlines()
        if line.startswith("leaderd_backend_request_seconds_count")
    )


def test_a_follower_asks_once_per_retry_interval_past_a_ttl(trio: list[Daemon]) -> None:
    """A renewal writes nothing in etcd: followers must not read that as a holder that went
    quiet and poll it ever faster once a ttl has passed."""
    leader = the_leader(trio)
    follower = next(d for d in trio if d is not leader)
    time.sleep(TTL + 0.5)
    before, t0 = backend_calls(follower), time.monotonic()
    time.sleep(2.0)
    rate = (backend_calls(follower) - before) / (time.monotonic() - t0)
    assert rate <= 1.5 / RETRY, f"{rate:.1f} requests/s"
    assert leaders(trio) == [leader]


def test_resign_to_hands_over_to_the_chosen_standby(trio: list[Daemon]) -> None:
    switchover.hands_over_to_the_chosen_standby(trio, TTL)


def test_a_stopped_chosen_standby_delays_the_failover_by_one_ttl(trio: list[Daemon]) -> None:
    switchover.fails_over_after_one_ttl_when_the_chosen_standby_is_stopped(trio, TTL)


def test_resign_to_a_standby_that_stopped_is_refused(trio: list[Daemon]) -> None:
    switchover.refuses_a_standby_that_stopped(trio, TTL)


def test_sigterm_grants_the_key_to_a_standby_that_leads_without_a_write(
    etcd: EtcdCluster, trio: list[Daemon]
) -> None:
    leader = the_leader(trio)
    time.sleep(3 * RETRY)  # every standby has offered its spare, and the leader has read it
    new, _ = hand_over(trio, signal.SIGTERM)
    term = term_of(new)
    assert f"granted term {term} by the release" in new.log()
    key = leader_key(etcd, new)
    assert (key["node_id"], key["term"]) == (new.node_id, term)
    released_to(new, leader, term_of(new) - 1, TTL)


def test_a_frozen_heir_loses_the_key_with_its_spare_and_never_leads_after_sigcont(
    trio: list[Daemon],
) -> None:
    """The key goes with the frozen heir's spare lease (etcd's lessor): its term ends
    "expired", not taken over."""
    within = 2 * TTL + LESSOR + SLACK
    switchover.frozen_heir_is_taken_over(trio, TTL, 3 * RETRY, within, "expired")


def test_a_lease_etcd_revokes_under_the_leader_ends_its_term_at_the_event(
    etcd: EtcdCluster, trio: list[Daemon]
) -> None:
    """What a resumed raft leader of etcd may do to a lease that is kept alive
    (tests/backends/etcd/test_lost.py): the holder says "not leader" at the deletion's watch
    event, and a standby takes the key only once the holder's deadline has surely passed (about
    one ttl after the holder's last heartbeat it saw); one leader at a time throughout.
    Three revocations: one that lands while the holder's renewal is in flight, or before its
    watch stream is created, is told by that renewal's answer instead, which takes the free
    key again at once (a later term of the same holder, no step-down between)."""
    told = []
    with Referee(trio):
        for _ in range(3):
            told.append(revoke_the_leaders_lease(etcd, trio))
    print(f"\nrevoked 3 times: {told}")
    at_the_event = [(down, up) for down, up in told if down]
    assert at_the_event, "no holder stepped down at the watch event of its key's deletion"
    for stepped_down, acquired in at_the_event:
        assert stepped_down <= acquired  # both logs are this host's wall clock, in ms


def revoke_the_leaders_lease(etcd: EtcdCluster, trio: list[Daemon]) -> tuple[str, str]:
    """Revoke the lease of the leader's key; when the holder logged that it stepped down
    at the deletion ("" if it learned otherwise), and when the next term was acquired."""
    leader = the_leader(trio)
    before = term_of(leader)
    url_prefix = leader.backend.split("prefix=", 1)[1].split("&", 1)[0]
    _, kv = etcd.get(f"{url_prefix}default/leader")
    etcd.post(etcd.members[0], "/v3/kv/lease/revoke", {"ID": int(kv["lease"])})
    new = wait_for(
        lambda: [d for d in leaders(trio) if term_of(d) > before],
        timeout=TTL + LESSOR + RENEW + SLACK,  # a standby waits out the holder's deadline
        what="a leader of a later term",
    )[0]
    said = f"stepping down from election default, term {before}: etcd deleted the leader key"
    assert term_of(new) > before
    # Judged once the holder has logged how its term ended, whatever told it: on a busy host
    # its line may come after the new leader's answer.
    wait_for(lambda: term_ended(leader, before), SLACK, what="the end of the holder's term")
    return logged_at(leader, said), first_acquisition_after(trio, before)


def term_ended(holder: Daemon, term: int) -> bool:
    """Whether ``holder``'s log tells the end of ``term``: a step-down, or (a renewal that
    found the key gone) a later term of its own acquired with no step-down before it."""
    for line in holder.log().splitlines():
        if f"stepping down from election default, term {term}:" in line:
            return True
        match = re.search(r"acquired election default, term (\d+)", line)
        if match and int(match.group(1)) > term:
            return True
    return False


def first_acquisition_after(trio: list[Daemon], term: int) -> str:
    """The timestamp of the first acquisition of a term above ``term`` that any daemon
    logged ("" if none): the next term may be the old holder's own, or not ``term + 1``."""
    found = []
    for daemon in trio:
        for line in daemon.log().splitlines():
            match = re.search(r"acquired election default, term (\d+)", line)
            if match and int(match.group(1)) > term:
                found.append(line.split(" ", 1)[0])
    return min(found, default="")


def logged_at(daemon: Daemon, sentence: str) -> str:
    """The timestamp of the first log line of ``daemon`` that has ``sentence``; "" if none."""
    lines = [line for line in daemon.log().splitlines() if sentence in line]
    return lines[0].split(" ", 1)[0] if lines else ""
