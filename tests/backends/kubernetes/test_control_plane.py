"""The test control plane is a real one: kube-apiserver answers, authenticates the
restricted ServiceAccount by its token and authorizes it by RBAC, leases and pod patches only."""

from typing import Any

import pytest

from tests.support.kube_cluster import NAMESPACE, SERVICE_ACCOUNT, ControlPlane

pytestmark = pytest.mark.kubernetes

LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def test_api_server_answers_readyz(kube: ControlPlane) -> None:
    answer = kube.anonymous().request("GET", "/readyz")
    assert (answer.status, answer.body) == (200, "ok")


def test_restricted_token_is_the_service_account(kube: ControlPlane) -> None:
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    answer = kube.restricted.ok("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", review)
    user = answer["status"]["userInfo"]["username"]
    assert user == f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"


def test_restricted_identity_creates_and_updates_a_lease(kube: ControlPlane) -> None:
    lease = {
        "metadata": {"name": "rbac"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }
    created = kube.restricted.ok("POST", LEASES, lease)
    created["spec"]["holderIdentity"] = "b"
    updated = kube.restricted.ok("PUT", f"{LEASES}/rbac", created)
    assert updated["spec"]["holderIdentity"] == "b"
    # The update was a compare-and-swap: the old resourceVersion no longer matches.
    assert kube.restricted.request("PUT", f"{LEASES}/rbac", created).status == 409


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets"),
        ("GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases"),
        ("POST", PODS),
        ("DELETE", f"{PODS}/app"),
    ],
)
def test_restricted_identity_is_refused_anything_else(
    kube: ControlPlane, method: str, path: str
) -> None:
    body: Any = {"metadata": {"name": "app"}} if method == "POST" else None
    assert kube.restricted.request(method, path, body).status == 403


def test_restricted_identity_patches_a_pod_label(kube: ControlPlane) -> None:
    pod = {
        "metadata": {"name": "labelled"},
        "spec": {
            "serviceAccountName": SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,
            "containers": [{"name": "app", "image": "leaderd:test"}],
        },
    }
    kube.admin.ok("POST", PODS, pod)
    patch = {"metadata": {"labels": {"leaderd.io/leader": "true"}}}
    patched = kube.restricted.ok("PATCH", f"{PODS}/labelled", patch, patch=True)
    assert patched["metadata"]["labels"] == {"leaderd.io/leader": "true"}
