"""--label-pod: the leader's pod carries the label while it leads (a Service selecting it
routes to the leader alone), it is reconciled, and removed before the release on a hand-over.
Pods are real API objects (no kubelet runs: they never start, and need not)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.daemons import Daemon, leaders, wait_for
from tests.kubernetes.cluster import NAMESPACE, SERVICE_ACCOUNT, ControlPlane
from tests.kubernetes.electors import LEASES
from tests.kubernetes.referee import MixedReferee

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
