"""kubernetes:// URLs and where the credentials come from: a kubeconfig file (JSON or YAML),
the pod's service account (in-cluster), and a rotated token read again; --label-pod's label."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from leaderd.backends.base import BackendFatal, BackendUnavailable, Candidate
from leaderd.backends.kubernetes.backend import KubernetesBackend
from leaderd.backends.kubernetes.config import KubeSettings
from leaderd.backends.kubernetes.labels import parse_label
from leaderd.startup.config import ConfigError, load
from tests.support.backend_calls import ask
from tests.support.kube_cluster import NAMESPACE, ControlPlane


def kubeconfig(path: Path, user: dict[str, str], namespace: str = "") -> str:
    config = {
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443/",
                                               "certificate-authority": "ca.crt"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u",
                                               "namespace": namespace}}],
        "current-context": "x",
    }  # fmt: skip
    path.write_text(json.dumps(config))
    return str(path)


def test_a_kubeconfig_gives_server_ca_token_and_namespace(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", {"tokenFile": "token"}, namespace="apps")
    s = KubeSettings.from_url(f"kubernetes://?kubeconfig={path}")
    assert (s.server, s.namespace, s.prefix) == ("https://127.0.0.1:6443", "apps", "leaderd-")
    assert (s.cafile, s.token_file) == (str(tmp_path / "ca.crt"), str(tmp_path / "token"))
    env = {"KUBECONFIG": path}
    assert KubeSettings.from_url("kubernetes:///ns?lease-prefix=x-", env).namespace == "ns"
    assert KubeSettings.from_url("kubernetes:///ns?lease-prefix=x-", env).lease_name("a") == "x-a"


def test_a_yaml_kubeconfig_is_read(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(
        "clusters:\n- name: c\n  cluster: {server: 'https://10.0.0.1:6443'}\n"
        "users:\n- name: u\n  user: {token: secret-token}\n"
        "contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"
    )
    s = KubeSettings.from_url(f"kubernetes:///ns?kubeconfig={path}")
    assert (s.server, s.token) == ("https://10.0.0.1:6443", "secret-token")
    assert "secret-token" not in repr(s) and "secret-token" not in s.description


def test_in_a_pod_the_service_account_is_used(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    (tmp_path / "namespace").write_text("prod\n")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    s = KubeSettings.from_url(f"kubernetes://?serviceaccount={tmp_path}", env)
    assert (s.server, s.namespace, s.source) == ("https://[fd00::1]:443", "prod", "in-cluster")
    assert s.token_file == str(tmp_path / "token")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("kubernetes://host/ns", "a host"),
        ("kubernetes:///ns?prefix=x", "unknown option"),
        ("kubernetes:///ns?lease-prefix=UPPER", "lease-prefix"),
        ("kubernetes:///Bad_NS", "namespace"),
        ("kubernetes:///ns?kubeconfig=/nonexistent/config", "cannot read kubeconfig"),
    ],
)
def test_bad_urls_are_fatal_and_say_why(url: str, says: str, tmp_path: Path) -> None:
    env = {"KUBECONFIG": kubeconfig(tmp_path / "config", {"token": "t"})}
    with pytest.raises(BackendFatal, match=says):
        KubeSettings.from_url(url, env)


def test_an_unknown_option_is_named_and_its_value_never_shown(tmp_path: Path) -> None:
    env = {"KUBECONFIG": kubeconfig(tmp_path / "config", {"token": "t"})}
    with pytest.raises(BackendFatal) as refused:
        KubeSettings.from_url("kubernetes:///ns?token=s3cr3t&lease-prefix=a-", env)
    assert "'token'" in str(refused.value) and "s3cr3t" not in str(refused.value)
    assert "lease-prefix=a-" in str(refused.value)


def test_an_election_that_cannot_name_a_lease_is_fatal(tmp_path: Path) -> None:
    s = KubeSettings.from_url(f"kubernetes:///ns?kubeconfig={kubeconfig(tmp_path / 'c', {})}")
    with pytest.raises(BackendFatal, match="Lease name"):
        s.lease_name("Jobs_Nightly")


def test_label_pod_takes_a_kubernetes_label() -> None:
    assert parse_label("leaderd.io/leader=true") == ("leaderd.io/leader", "true")
    assert parse_label("role=") == ("role", "")
    for bad in ("no-equals", "-bad=x", "k=" + "v" * 64, "a/b/c=x"):
        with pytest.raises(ValueError, match="no KEY=VALUE label"):
            parse_label(bad)
    with pytest.raises(ConfigError, match="label_pod"):
        load({"label_pod": "bad label", "backend": "static://"}, env={})


@pytest.mark.kubernetes
async def test_a_rotated_token_is_read_again(kube: ControlPlane, tmp_path: Path) -> None:
    """In a pod: the token file kubelet replaces is read again at the next request; a token
    the API server refuses (401) is BackendUnavailable, never fatal, and never logged."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    shutil.copyfile(kube.admin.cacert, account / "ca.crt")
    (account / "token").write_text("not-a-token")
    host, port = kube.admin.server.removeprefix("https://").rsplit(":", 1)
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
    url = f"kubernetes:///{NAMESPACE}?serviceaccount={account}&lease-prefix=rot-"
    backend = KubernetesBackend(KubeSettings.from_url(url, env))
    try:
        with pytest.raises(BackendUnavailable, match="401") as refused:
            await backend.observe("default")
        assert "not-a-token" not in str(refused.value)
        replacement = account / "token.new"
        replacement.write_text(kube.restricted.token or "")
        replacement.rename(account / "token")  # as kubelet's atomic writer swaps it
        lease = await ask(backend, "default", Candidate("a"), 30.0, timeout=10.0)
        assert lease.holder == "a"
    finally:
        await backend.close()
