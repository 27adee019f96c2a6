"""The takeover rule on kubernetes:// with real daemons: a leader that crashed (SIGKILL) or
froze (SIGSTOP) is taken over once a standby has seen its Lease unchanged for one ttl; the
frozen one, thawed, answers "not leader" at once. A referee watches every answer."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from tests.backends.kubernetes.referee import MixedReferee
from tests.support.daemons import Daemon, history, leaders, wait_for
from tests.support.kube_cluster import NAMESPACE, ControlPlane

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow, pytest.mark.timeout(180)]

TTL = 3.0


def three(kube: ControlPlane, tmp_path: Path, workdir: str) -> list[Daemon]:
    kubeconfig = kube.restricted.kubeconfig(str(tmp_path / "daemon.kubeconfig"))
    url = f"kubernetes:///{NAMESPACE}?lease-prefix=t{uuid.uuid4().hex[:8]}-&kubeconfig={kubeconfig}"
    return [
        Daemon(f"node-{i}", url, workdir=workdir, ttl=TTL, renew_interval=0.75,
               retry_interval=0.25).start()
        for i in range(3)
    ]  # fmt: skip


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP], ids=["crashed", "frozen"])
def test_a_silent_leader_is_taken_over_after_one_ttl(
    kube: ControlPlane, tmp_path: Path, workdir: str, signum: int
) -> None:
    daemons = three(kube, tmp_path, workdir)
    with MixedReferee(daemons, []) as referee:
        leader = wait_for(lambda: leaders(daemons), timeout=30, what="a leader")[0]
        term = leader.get("/leader")[1]["term"]
        referee.wait_seen(leader)
        others = [d for d in daemons if d is not leader]
        leader.signal(signum)
        successor = wait_for(lambda: leaders(others), timeout=TTL * 4, what="a successor")[0]
        assert successor.get("/leader")[1]["term"] > term
        taken = (term, leader.node_id, "taken over after expiry")
        wait_for(lambda: history(successor, 2)[1:] == [taken], timeout=10,
                 what="the history to say the term was taken over")  # fmt: skip
        if signum == signal.SIGSTOP:
            leader.signal(signal.SIGCONT)
            assert leader.is_leader() is False  # its first answer after the pause
            wait_for(lambda: leader.get("/status")[1]["elections"]["default"]["leader"],
                     timeout=10, what="the thawed daemon to follow")  # fmt: skip
        referee.wait_seen(successor)
