"""The Kubernetes example, checked with kubernetes-validate against the API schema,
and read for the choices that make leaderd safe as a sidecar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ._tools import ROOT, default_shutdown_timeout, require, run

pytestmark = pytest.mark.deploy

EXAMPLE = ROOT / "examples" / "kubernetes"
MANIFESTS = [
    "deployment.yaml",
    "pdb.yaml",
    "networkpolicy.yaml",
    "secret.example.yaml",
    "lease.yaml",
]


def validate(*files: Path) -> str:
    tool = require("kubernetes-validate")
    done = run([tool, "--strict", *files], check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_passes_kubernetes_validate(name: str) -> None:
    assert "passed" in validate(EXAMPLE / name)


def test_kubernetes_validate_rejects_a_broken_sidecar(tmp_path: Path) -> None:
    """The check above can fail: a misspelt field of the sidecar is refused."""
    tool = require("kubernetes-validate")
    broken = tmp_path / "deployment.yaml"
    text = (EXAMPLE / "deployment.yaml").read_text()
    broken.write_text(text.replace("restartPolicy: Always", "restartPolicyy: Always"))
    done = run([tool, "--strict", broken], check=False)
    assert done.returncode != 0, done.stdout


@pytest.fixture(scope="module")
def pod() -> dict[str, Any]:
    import yaml  # comes with kubernetes-validate

    deployment = yaml.safe_load((EXAMPLE / "deployment.yaml").read_text())
    assert deployment["kind"] == "Deployment"
    assert deployment["spec"]["replicas"] == 3
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def sidecar(pod: dict[str, Any]) -> dict[str, Any]:
    (leaderd,) = [c for c in pod["initContainers"] if c["name"] == "leaderd"]
    return leaderd


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_leaderd_is_a_native_sidecar(pod: dict[str, Any]) -> None:
    assert sidecar(pod)["restartPolicy"] == "Always"
    assert all(c["name"] != "leaderd" for c in pod["containers"])


def test_socket_is_shared_through_an_emptydir(pod: dict[str, Any]) -> None:
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in [sidecar(pod), *pod["containers"]]:
        mounts = [m for m in container["volumeMounts"] if m["mountPath"] == "/run/leaderd"]
        assert mounts, f"{container['name']} does not mount /run/leaderd"
        assert "emptyDir" in volumes[mounts[0]["name"]]
    assert env(sidecar(pod))["LEADERD_SOCKET"] == "/run/leaderd/leaderd.sock"


def test_identity_comes_from_the_downward_api_and_backend_from_a_secret(
    pod: dict[str, Any],
) -> None:
    values = env(sidecar(pod))
    assert values["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert values["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert values["LEADERD_NODE_ID"] == "$(POD_NAME)"
    assert values["LEADERD_ADDRESS"].startswith("$(POD_IP)")
    secret = values["LEADERD_BACKEND"]["secretKeyRef"]
    import yaml

    example = yaml.safe_load((EXAMPLE / "secret.example.yaml").read_text())
    assert secret["name"] == example["metadata"]["name"]
    assert secret["key"] in example["stringData"]


def test_probes_use_health_and_ready_never_leader(pod: dict[str, Any]) -> None:
    leaderd = sidecar(pod)
    assert leaderd["livenessProbe"]["httpGet"]["path"] == "/health"
    assert leaderd["readinessProbe"]["httpGet"]["path"] == "/ready"
    port = leaderd["readinessProbe"]["httpGet"]["port"]
    (listener,) = [p for p in leaderd["ports"] if port in (p["name"], p["containerPort"])]
    # [::]: IPv6 and IPv4, so single-stack IPv6 clusters' probes reach it too.
    assert env(leaderd)["LEADERD_LISTEN"] == f"[::]:{listener['containerPort']}"
    text = (EXAMPLE / "deployment.yaml").read_text()
    assert "path: /leader" not in text, "readiness or liveness tied to leadership"


def test_grace_period_covers_app_and_leaderd_shutdown(pod: dict[str, Any]) -> None:
    # Sidecars stop after the app, inside the same grace period.
    assert pod["terminationGracePeriodSeconds"] >= default_shutdown_timeout() + 10


def test_containers_are_non_root_read_only_and_bounded(pod: dict[str, Any]) -> None:
    assert pod["securityContext"]["runAsNonRoot"] is True
    for container in [sidecar(pod), *pod["containers"]]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["runAsUser"] != 0, container["name"]
        assert {"requests", "limits"} <= set(container["resources"]), container["name"]
        assert "memory" in container["resources"]["limits"], container["name"]


def test_readme_explains_why_readiness_is_not_leadership() -> None:
    readme = (EXAMPLE / "README.md").read_text()
    assert "/ready" in readme and "/leader" in readme
    assert "rolling update" in readme.lower()


def manifest(name: str) -> dict[str, Any]:
    import yaml

    loaded: dict[str, Any] = yaml.safe_load((EXAMPLE / name).read_text())
    return loaded


def test_election_is_namespaced(pod: dict[str, Any]) -> None:
    """Staging and production sharing one database must not share a leader."""
    values = env(sidecar(pod))
    assert values["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert values["LEADERD_ELECTIONS"].startswith("$(POD_NAMESPACE).")
    names = [e["name"] for e in sidecar(pod)["env"]]
    assert names.index("POD_NAMESPACE") < names.index("LEADERD_ELECTIONS")  # $() needs order


def test_replicas_spread_over_nodes_and_carry_no_token(pod: dict[str, Any]) -> None:
    assert pod["automountServiceAccountToken"] is False
    by_key = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    nodes = by_key["kubernetes.io/hostname"]
    assert nodes["maxSkew"] == 1 and nodes["whenUnsatisfiable"] == "DoNotSchedule"
    assert nodes["labelSelector"]["matchLabels"] == {"app.kubernetes.io/name": "my-app"}


def test_disruption_budget_keeps_a_standby() -> None:
    pdb = manifest("pdb.yaml")
    deployment = manifest("deployment.yaml")
    assert pdb["kind"] == "PodDisruptionBudget"
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert pdb["spec"]["maxUnavailable"] == 1 < deployment["spec"]["replicas"] - 1


def test_network_policy_admits_the_probe_port_from_monitoring_only(pod: dict[str, Any]) -> None:
    policy = manifest("networkpolicy.yaml")
    assert policy["spec"]["podSelector"] == manifest("deployment.yaml")["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (port,) = [p["containerPort"] for p in sidecar(pod)["ports"]]
    rules = [r for r in policy["spec"]["ingress"] if any(p["port"] == port for p in r["ports"])]
    (rule,) = rules
    (source,) = rule["from"]
    assert list(source) == ["namespaceSelector"]  # no pod of any namespace, no ipBlock


def test_readme_states_the_sidecar_version_and_the_fallback() -> None:
    readme = (EXAMPLE / "README.md").read_text()
    assert "Kubernetes 1.29 or\nlater" in readme or "Kubernetes 1.29 or later" in readme
    assert "preStop" in readme and "Init:0/1" in readme


def test_the_lease_example_needs_no_database_and_routes_to_the_leader() -> None:
    """lease.yaml: kubernetes:// with the pod's own credentials, the leader's pod labelled,
    a Service selecting that label, RBAC for leases and pod labels only, the token in
    leaderd's container alone."""
    import yaml

    docs = {d["kind"]: d for d in yaml.safe_load_all((EXAMPLE / "lease.yaml").read_text())}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    leaderd, app = sidecar(pod), pod["containers"][0]
    settings = env(leaderd)
    assert settings["LEADERD_BACKEND"].startswith("kubernetes:///")
    assert not any("secretKeyRef" in str(v) for v in settings.values())
    key, value = settings["LEADERD_LABEL_POD"].split("=")
    assert docs["Service"]["spec"]["selector"] == {
        **docs["Deployment"]["spec"]["selector"]["matchLabels"],
        key: value,
    }
    assert env(leaderd)["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    rules = {(r["apiGroups"][0], r["resources"][0]): r["verbs"] for r in docs["Role"]["rules"]}
    assert set(rules) == {("coordination.k8s.io", "leases"), ("", "pods")}
    assert rules["", "pods"] == ["get", "patch"]
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False
    token = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert token in [m["mountPath"] for m in leaderd["volumeMounts"]]
    assert token not in [m["mountPath"] for m in app["volumeMounts"]]
