"""--label-pod: the leader's pod carries the label while it leads (a Service selecting it
routes to the leader alone), it is reconciled, and removed before the release on a hand-over.
Pods are real API objects (no kubelet runs: they never start, and need not)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest

from leaderd.backends.kubernetes.config import KubeSettings
from leaderd.backends.kubernetes.pod_label import PodLabel
from tests.backends.kubernetes.referee import MixedReferee
from tests.support.daemons import Daemon, leaders, wait_for
from tests.support.kube_cluster import NAMESPACE, SERVICE_ACCOUNT, ControlPlane
from tests.support.kube_electors import LEASES

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow, pytest.mark.timeout(180)]

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
KEY, VALUE = "leaderd.io/leader", "true"


def new_pod(kube: ControlPlane, name: str) -> None:
    pod = {
        "metadata": {"name": name, "labels": {"app": "labelled"}},
        "spec": {
            "serviceAccountName": SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,
            "containers": [{"name": "app", "image": "leaderd:test"}],
        },
    }
    kube.admin.ok("POST", PODS, pod)


def labels(kube: ControlPlane, pod: str) -> dict[str, str]:
    labelled: dict[str, str] = kube.admin.ok("GET", f"{PODS}/{pod}")["metadata"]["labels"]
    return labelled


def version(kube: ControlPlane, path: str) -> int:
    return int(kube.admin.ok("GET", path)["metadata"]["resourceVersion"])


def test_the_leaders_pod_alone_carries_the_label(
    kube: ControlPlane, tmp_path: Path, workdir: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    kubeconfig = kube.restricted.kubeconfig(str(tmp_path / "daemon.kubeconfig"))
    url = f"kubernetes:///{NAMESPACE}?lease-prefix=l{tag}-&kubeconfig={kubeconfig}"
    pods = {f"node-{i}": f"pod-{tag}-{i}" for i in range(2)}
    for pod in pods.values():
        new_pod(kube, pod)
    daemons = [
        Daemon(node, url, workdir=workdir, ttl=4.0, renew_interval=1.0, retry_interval=0.25,
               extra_args=("--label-pod", f"{KEY}={VALUE}"), env={"POD_NAME": pod}).start()
        for node, pod in pods.items()
    ]  # fmt: skip
    with MixedReferee(daemons, []):
        leader = wait_for(lambda: leaders(daemons), timeout=30, what="a leader")[0]
        standby = next(d for d in daemons if d is not leader)
        wait_for(lambda: labels(kube, pods[leader.node_id]).get(KEY) == VALUE, timeout=10,
                 what="the leader's pod to be labelled")  # fmt: skip
        assert KEY not in labels(kube, pods[standby.node_id])
        assert labels(kube, pods[leader.node_id])["app"] == "labelled"  # the rest is kept

        # Reconciled: a label someone removes comes back within a renewal or so.
        kube.admin.ok("PATCH", f"{PODS}/{pods[leader.node_id]}",
                      {"metadata": {"labels": {KEY: None}}}, patch=True)  # fmt: skip
        wait_for(lambda: labels(kube, pods[leader.node_id]).get(KEY) == VALUE, timeout=10,
                 what="the label to come back")  # fmt: skip

        # A hand-over moves the label to the new leader's pod.
        assert leader.stop() == 0
        assert KEY not in labels(kube, pods[leader.node_id])
        wait_for(lambda: standby.is_leader(), timeout=10, what="the standby to lead")
        wait_for(lambda: labels(kube, pods[standby.node_id]).get(KEY) == VALUE, timeout=10,
                 what="the new leader's pod to be labelled")  # fmt: skip

        # The label goes before the release: resourceVersions are one etcd's revisions, so
        # the pod's last change (the removal) precedes the Lease's (the release).
        assert standby.stop() == 0
        lease = f"{LEASES}/l{tag}-default"
        assert kube.admin.ok("GET", lease)["spec"]["holderIdentity"] == ""
        assert KEY not in labels(kube, pods[standby.node_id])
        assert version(kube, f"{PODS}/{pods[standby.node_id]}") < version(kube, lease)


class Following:
    """What the label follows, as the test sets it: the seconds left of the hold."""

    def __init__(self) -> None:
        self.step_down_hook: Any = None
        self.left: float | None = None
        self.listeners: list[Any] = []

    def lease_left(self) -> float | None:
        return self.left

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def change(self, left: float | None) -> None:
        self.left = left
        for listener in self.listeners:
            listener(None)


async def until_labelled(kube: ControlPlane, pod: str, present: bool) -> None:
    for _ in range(200):
        if (KEY in await asyncio.to_thread(labels, kube, pod)) == present:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the label never became {'present' if present else 'absent'}")


async def test_the_step_down_hook_removes_the_label_before_it_returns(
    kube: ControlPlane, tmp_path: Path
) -> None:
    """The hand-over awaits the hook before its release: when the hook returns, the pod has
    no label (the run loop is not told, so only the hook can have removed it). And a hold
    with less than one renewal interval left loses the label before its deadline."""
    pod = f"pod-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(new_pod, kube, pod)
    kubeconfig = kube.restricted.kubeconfig(str(tmp_path / "kubeconfig"))
    settings = KubeSettings.from_url(f"kubernetes:///{NAMESPACE}?kubeconfig={kubeconfig}")
    label = PodLabel(settings, (KEY, VALUE), 1.0, env={"POD_NAME": pod})
    election = Following()
    label.follow(election)
    running = asyncio.create_task(label.run(election))
    try:
        election.change(10.0)
        await until_labelled(kube, pod, True)
        election.left = None  # stopping, unannounced: the loop would notice only later
        await election.step_down_hook("default")
        assert KEY not in await asyncio.to_thread(labels, kube, pod)

        election.change(10.0)
        await until_labelled(kube, pod, True)
        election.change(0.9)  # an outage: less than one renewal interval left
        await until_labelled(kube, pod, False)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await label.close()


def test_the_label_works_beside_any_backend(
    kube: ControlPlane, tmp_path: Path, workdir: str
) -> None:
    """On sqlite:// the label's credentials come from $KUBECONFIG (in a pod: its service
    account), the namespace from $POD_NAMESPACE; SIGTERM removes the label."""
    pod = f"pod-{uuid.uuid4().hex[:8]}"
    new_pod(kube, pod)
    kubeconfig = kube.restricted.kubeconfig(str(tmp_path / "kubeconfig"))
    env = {"POD_NAME": pod, "POD_NAMESPACE": NAMESPACE, "KUBECONFIG": kubeconfig}
    daemon = Daemon("node-a", f"sqlite://{tmp_path}/lease.db", workdir=workdir,
                    extra_args=("--label-pod", f"{KEY}={VALUE}"), env=env).start()  # fmt: skip
    wait_for(lambda: daemon.is_leader(), timeout=30, what="the daemon to lead")
    wait_for(lambda: labels(kube, pod).get(KEY) == VALUE, timeout=10, what="the label")
    assert daemon.stop() == 0
    assert KEY not in labels(kube, pod)
