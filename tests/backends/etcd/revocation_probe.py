"""Does this etcd revoke a lease that a client keeps alive? (docs/etcd.md, "A lease etcd
revokes while it is kept alive")

    python -m tests.backends.etcd.revocation_probe [--trials 16] [--pause 3.0]

Each trial grants a 2 s lease with a key under it, keeps it alive every 0.2 s through the
followers only, pauses the raft leader (SIGSTOP) for ``--pause`` seconds and resumes it,
then keeps the lease alive 3 s more. A key that is gone although no two good keepalives were
more than the lease's ttl apart was revoked by etcd under a live client. No leaderd here:
this measures etcd itself, on a fresh 3-member cluster (tests/support/etcd_cluster.py).
"""

from __future__ import annotations

import argparse
import base64
import itertools
import threading
import time

from tests.support.etcd_cluster import EtcdCluster, Member

LEASE_TTL = 2


def keep_alive(
    cluster: EtcdCluster, via: list[Member], lease: int, stop: threading.Event, gaps: list[float]
) -> None:
    """Keepalives every 0.2 s until ``stop`` or until etcd says the lease is gone; appends
    the longest time the lease went without a good keepalive before that."""
    good = [time.monotonic()]
    while not stop.is_set():
        for member in via:
            try:
                answer = cluster.post(member, "/v3/lease/keepalive", {"ID": lease}, timeout=0.3)
            except OSError:
                continue  # a member that does not answer says nothing of the lease
            good.append(time.monotonic())
            if int(answer.get("result", {}).get("TTL", 0)) <= 0:
                stop.set()  # gone: its gap from the last good keepalive counts too
            break
        time.sleep(0.2)
    gaps.append(max(b - a for a, b in itertools.pairwise(good)))


def trial(cluster: EtcdCluster, n: int, pause: float) -> tuple[bool, float]:
    """One pause of the raft leader: (the key was revoked under a live client, longest gap)."""
    leader = cluster.wait_healthy()
    followers = [m for m in cluster.members if m is not leader]
    lease = int(cluster.post(followers[0], "/v3/lease/grant", {"TTL": LEASE_TTL})["ID"])
    key = f"/revocation-probe/{n}"
    body = {"key": base64.b64encode(key.encode()).decode(), "value": "", "lease": lease}
    cluster.post(followers[0], "/v3/kv/put", body)
    stop, gaps = threading.Event(), list[float]()
    keeper = threading.Thread(target=keep_alive, args=(cluster, followers, lease, stop, gaps))
    keeper.start()
    time.sleep(0.5)
    cluster.pause(leader)
    time.sleep(pause)
    cluster.resume(leader)
    time.sleep(3.0)
    stop.set()
    keeper.join()
    value, _ = cluster.get(key)
    return value is None and gaps[0] < LEASE_TTL, gaps[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--pause", type=float, default=3.0)
    args = parser.parse_args()
    cluster = EtcdCluster(3)
    revoked = 0
    try:
        for n in range(args.trials):
            lost, gap = trial(cluster, n, args.pause)
            revoked += lost
            print(f"trial {n}: {'REVOKED' if lost else 'kept'} (longest keepalive gap {gap:.2f} s)")
    finally:
        cluster.cleanup()
    print(f"revoked under a live client: {revoked} of {args.trials} pauses of the raft leader")


if __name__ == "__main__":
    main()
