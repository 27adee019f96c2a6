"""leaderd and client-go on one Lease: three daemons on kubernetes:// beside the client-go
elector, a referee over all of them, and the Lease handed over in both directions. What
leaderd writes reads as a client-go Lease does (kubectl get lease -o yaml)."""

from __future__ import annotations

import datetime as dt
import math
import signal
import uuid
from pathlib import Path

import pytest

from tests.backends.kubernetes.referee import MixedReferee
from tests.support.daemons import Daemon, leaders, wait_for
from tests.support.kube_cluster import ControlPlane
from tests.support.kube_electors import LEASES, Elector

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow, pytest.mark.timeout(240)]

# Both sides' leases outlast every wait of the test: only a release hands the Lease over.
TTL = 60.0
# client-go's LeaseDuration, RenewDeadline and RetryPeriod.
ELECTOR_TIMING = ("600s", "10s", "250ms")


def kube_url(kube: ControlPlane, workdir: Path, prefix: str) -> str:
    kubeconfig = kube.restricted.kubeconfig(str(workdir / "daemon.kubeconfig"))
    return f"kubernetes:///leaderd-test?lease-prefix={prefix}&kubeconfig={kubeconfig}"


def daemons_on(url: str, workdir: str, n: int = 3) -> list[Daemon]:
    return [
        Daemon(f"node-{i}", url, workdir=workdir, elections=("interop",), ttl=TTL,
               renew_interval=1.0, retry_interval=0.25).start()
        for i in range(n)
    ]  # fmt: skip


def followed(d: Daemon) -> str | None:
    """The holder a daemon's /status names for the election, if any."""
    leader = d.get("/status")[1]["elections"]["interop"]["leader"]
    return leader["node_id"] if leader else None


def spec_of(kube: ControlPlane, lease: str) -> dict[str, object]:
    spec: dict[str, object] = kube.admin.ok("GET", f"{LEASES}/{lease}")["spec"]
    return spec


def micro_time(value: object) -> dt.datetime:
    """A MicroTime as kubectl prints it: RFC 3339, UTC, six fractional digits."""
    assert isinstance(value, str) and value.endswith("Z") and len(value.split(".")[1]) == 7
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_leaderd_and_client_go_hand_over_both_ways(
    kube: ControlPlane, electors: list[Elector], tmp_path: Path, workdir: str
) -> None:
    prefix = f"i{uuid.uuid4().hex[:8]}-"
    lease = prefix + "interop"
    first = Elector(kube, lease, "client-go-a", tmp_path, ELECTOR_TIMING)
    electors.append(first)
    first.wait_line("leading")
    daemons = daemons_on(kube_url(kube, tmp_path, prefix), workdir)
    with MixedReferee(daemons, electors) as referee:
        for d in daemons:
            d.wait_ready(30)
        # The daemons follow client-go's holder and none of them leads.
        wait_for(lambda: all(followed(d) for d in daemons), timeout=30,
                 what="the daemons to name client-go's holder")  # fmt: skip
        assert {followed(d) for d in daemons} == {"client-go-a"} and not leaders(daemons)

        # client-go -> leaderd: SIGTERM releases the Lease (600 s long), a daemon takes it.
        first.terminate()
        assert first.wait_exit() == 0
        leader = wait_for(lambda: leaders(daemons), timeout=30, what="a daemon to lead")[0]
        spec = spec_of(kube, lease)
        assert spec["holderIdentity"] == leader.node_id
        assert spec["leaseDurationSeconds"] == math.ceil(TTL)
        assert spec["leaseTransitions"] == 1
        acquired, renewed = micro_time(spec["acquireTime"]), micro_time(spec["renewTime"])
        assert acquired <= renewed
        wait_for(lambda: micro_time(spec_of(kube, lease)["renewTime"]) > renewed, timeout=10,
                 what="a renewal to move renewTime")  # fmt: skip
        assert spec_of(kube, lease)["acquireTime"] == spec["acquireTime"]

        # A client-go elector started now sees leaderd's holder and waits.
        second = Elector(kube, lease, "client-go-b", tmp_path, ELECTOR_TIMING)
        electors.append(second)
        assert second.wait_line("leader ") == f"leader {leader.node_id}"
        assert "leading" not in second.lines

        # leaderd -> client-go: the standbys leave, the leader's SIGTERM releases the Lease
        # (60 s long), and client-go's next retry takes it.
        for d in daemons:
            if d is not leader:
                assert d.stop() == 0
        assert leader.stop() == 0
        second.wait_line("leading", timeout=30)
        spec = spec_of(kube, lease)
        assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("client-go-b", 2)
    assert referee.led(leader.node_id), "the referee never saw the daemon lead"


def test_client_go_takes_over_from_a_frozen_daemon_only_after_its_deadline(
    kube: ControlPlane, electors: list[Elector], tmp_path: Path, workdir: str
) -> None:
    """leaderd leads, client-go stands by; the daemon is frozen (SIGSTOP). client-go takes the
    Lease once it has seen it unchanged for leaseDurationSeconds, and the thawed daemon's
    first answer is "not leader": the referee finds no instant with two leaders."""
    prefix = f"z{uuid.uuid4().hex[:8]}-"
    url = kube_url(kube, tmp_path, prefix)
    (daemon,) = daemons = [
        Daemon("node-0", url, workdir=workdir, elections=("interop",), ttl=4.0,
               renew_interval=1.0, retry_interval=0.25).start()
    ]  # fmt: skip
    with MixedReferee(daemons, electors):
        wait_for(lambda: leaders(daemons), timeout=30, what="the daemon to lead")
        standby = Elector(kube, prefix + "interop", "client-go-c", tmp_path, ("4s", "3s", "250ms"))
        electors.append(standby)
        assert standby.wait_line("leader ") == "leader node-0"
        daemon.signal(signal.SIGSTOP)
        try:
            standby.wait_line("leading", timeout=30)
        finally:
            daemon.signal(signal.SIGCONT)
        assert daemon.is_leader() is False
        spec = spec_of(kube, prefix + "interop")
        assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("client-go-c", 2)
