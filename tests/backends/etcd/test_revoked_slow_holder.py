"""A lease etcd revokes under a holder that hears of it late (docs/etcd.md, "A lease etcd
revokes while it is kept alive"): real daemons, each on one member of the real cluster.

The holder is frozen (SIGSTOP) and so is the etcd member it talks to, so neither the watch
event of its key's deletion nor a renewal's answer can reach it: it stands for a holder whose
process a starved CPU schedules late. Its self-fence deadline (ttl 6 s) is far ahead when its
key's lease is revoked by hand, as a resumed raft leader revokes it. A standby may lead only
once that deadline has surely passed: the holder, resumed the moment a standby leads, must not
answer "leader" then.
"""

from __future__ import annotations

import signal
import time
import urllib.error

import pytest

from tests.backends.etcd.test_process import RETRY, SLACK, prefix, running, term_of, the_leader
from tests.support.chaos.check import Claim
from tests.support.daemons import Daemon, leaders, wait_for
from tests.support.etcd_cluster import EtcdCluster, Member
from tests.support.referee import Referee

pytestmark = pytest.mark.slow

TTL = 6.0  # the holder's deadline is seconds ahead when its key goes


def test_a_standby_waits_out_the_deadline_of_a_holder_whose_lease_etcd_revoked(
    etcd: EtcdCluster,
) -> None:
    election_prefix = prefix()
    urls = [etcd.url(prefix=election_prefix, members=[m]) for m in etcd.members]
    with running(urls, ttl=TTL) as trio:
        holder = the_leader(trio, timeout=TTL + SLACK)
        before = term_of(holder)
        member = etcd.members[trio.index(holder)]
        others = [m for m in etcd.members if m is not member]
        standbys = [d for d in trio if d is not holder]
        _, kv = etcd.get(f"{election_prefix}default/leader")
        with Referee(standbys) as referee:
            etcd.pause(member)
            holder.signal(signal.SIGSTOP)
            try:
                revoke_by_hand(etcd, others, int(kv["lease"]))
                new = wait_for(
                    lambda: leaders(standbys), timeout=2 * TTL + RETRY + SLACK, what="a standby"
                )[0]
                referee.claims.append(claim(new))  # seen leading before the holder is asked
                holder.signal(signal.SIGCONT)
                sent = time.monotonic()
                code, body = holder.get("/leader", timeout=2 * TTL)
                answered = time.monotonic()
            finally:
                holder.signal(signal.SIGCONT)
                etcd.resume(member)
            print(f"\nholder {holder.node_id} answered {code} {body} after {new.node_id} led")
            if code == 200:  # "leader": judged against the standby's claims
                referee.claims.append(Claim(holder.node_id, body["term"], sent, answered))
        assert term_of(new) > before


def revoke_by_hand(etcd: EtcdCluster, members: list[Member], lease: int) -> None:
    """Revoke ``lease`` within 4 ttls; a failure names etcd's last answers."""
    tried: list[str] = []
    try:
        wait_for(lambda: revoked(etcd, members, lease, tried), 4 * TTL, 0.1, "a revoke")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; etcd's last answers: {tried[-3:]}") from None


def revoked(etcd: EtcdCluster, members: list[Member], lease: int, tried: list[str]) -> bool:
    """Revoke ``lease`` through the first of ``members``: False while they have no raft
    leader (the paused member may have led raft: the others elect one first). A lease etcd
    no longer has is gone with its key all the same (its lessor expired it meanwhile)."""
    try:
        etcd.post(members[0], "/v3/kv/lease/revoke", {"ID": lease})
    except urllib.error.HTTPError as exc:  # 503: no raft leader yet
        said = exc.read().decode(errors="replace")
        tried.append(f"{exc.code} {said}")
        return "lease not found" in said
    except (urllib.error.URLError, TimeoutError) as exc:
        tried.append(repr(exc))
        return False
    return True


def claim(leader: Daemon) -> Claim:
    """The answer of ``leader``'s /leader, which must say "leader"."""
    sent = time.monotonic()
    code, body = leader.get("/leader")
    assert code == 200, body
    return Claim(leader.node_id, body["term"], sent, time.monotonic())
