"""A throwaway Kubernetes control plane for tests: the real kube-apiserver on one etcd.

``ControlPlane()`` builds (or finds cached) kube-apiserver and the client-go elector with
tests/backends/kubernetes/build.sh, starts a one-member etcd (tests/support/etcd_cluster.py) and
the API server on free 127.0.0.1 ports in a temporary directory, with a CA and a serving certificate
for 127.0.0.1, a service-account signing key, and a static token for an administrator in
system:masters. Once /readyz answers, the administrator creates the namespace NAMESPACE, the
ServiceAccount SERVICE_ACCOUNT, and a Role and RoleBinding granting it only leases
(coordination.k8s.io) and pod get/patch: ``restricted`` is that account, with a token from the
TokenRequest API, exactly what a pod mounts. No controller-manager, scheduler or kubelet runs: pods
exist as API objects only.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.etcd_cluster import EtcdCluster, free_port
from tests.support.tls import new_ca, new_key, new_signed, public_key

BUILD = Path(__file__).resolve().parents[1] / "backends" / "kubernetes" / "build.sh"
NAMESPACE = "leaderd-test"
SERVICE_ACCOUNT = "leaderd"
ROLE_RULES = [
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]},
]


def role_binding() -> dict[str, Any]:
    """The RoleBinding that grants SERVICE_ACCOUNT the Role of ROLE_RULES (faults delete it,
    and create it again from here)."""
    return {
        "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": SERVICE_ACCOUNT},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT,
                      "namespace": NAMESPACE}],
    }  # fmt: skip


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or set up; the message says why."""


def binaries() -> Path:
    """The directory holding kube-apiserver and elector, built on first use (cached)."""
    out = subprocess.run(
        ["bash", str(BUILD)], capture_output=True, text=True, timeout=3600, check=False
    )
    if out.returncode != 0:
        raise ControlPlaneError(f"{BUILD} failed: {out.stderr.strip()[-2000:]}")
    return Path(out.stdout.strip())


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # the decoded JSON, or the text when it is not JSON


@dataclass(frozen=True)
class Client:
    """One identity's requests to the API server (no token: anonymous)."""

    server: str
    cacert: str
    token: str | None

    def request(self, method: str, path: str, body: Any = None, patch: bool = False) -> Answer:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            merge = "application/merge-patch+json"
            headers["Content-Type"] = merge if patch else "application/json"
        request = urllib.request.Request(self.server + path, data, headers, method=method)
        context = ssl.create_default_context(cafile=self.cacert)
        try:
            with urllib.request.urlopen(request, timeout=30, context=context) as response:
                return _answer(response.status, response.read())
        except urllib.error.HTTPError as error:
            return _answer(error.code, error.read())

    def ok(self, method: str, path: str, body: Any = None, patch: bool = False) -> Any:
        """The body of a 2xx answer; anything else raises ControlPlaneError."""
        answer = self.request(method, path, body, patch)
        if not 200 <= answer.status < 300:
            raise ControlPlaneError(f"{method} {path}: {answer.status} {answer.body}")
        return answer.body

    def kubeconfig(self, path: str) -> str:
        """Write a kubeconfig for this identity (JSON is YAML, which kubeconfig loaders read)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.server, "certificate-authority": self.cacert},
                }
            ],
            "users": [{"name": "test", "user": {"token": self.token} if self.token else {}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            "current-context": "test",
        }
        # Whole or not at all: a process started earlier may be reading the same path (the
        # bench's electors share one), and a truncated file is no configuration.
        partial = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(config, f)
        os.replace(partial, path)
        return path


def _answer(status: int, raw: bytes) -> Answer:
    try:
        return Answer(status, json.loads(raw))
    except ValueError:
        return Answer(status, raw.decode(errors="replace"))


class ControlPlane:
    def __init__(self) -> None:
        self.bin = binaries()
        self.workdir = tempfile.mkdtemp(prefix="ld-kube-", dir="/tmp")
        self.log_path = os.path.join(self.workdir, "kube-apiserver.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.etcd: EtcdCluster | None = None
        try:
            self.etcd = EtcdCluster(1)
            self.admin = self._start()
            self.wait_ready()
            self.restricted = self._set_up_namespace()
        except BaseException:
            self.cleanup()
            raise

    @property
    def elector(self) -> str:
        return str(self.bin / "elector")

    def anonymous(self) -> Client:
        return Client(self.admin.server, self.admin.cacert, None)

    def _start(self) -> Client:
        """Certificates, keys and the token file, then the API server; the admin's client."""
        assert self.etcd is not None
        d = self.workdir
        ca = new_ca(d, "kube-ca")
        usage = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
        cert, key = new_signed(d, "kube-apiserver", ca, usage)
        sa_key, sa_pub = (os.path.join(d, f"service-account.{kind}") for kind in ("key", "pub"))
        new_key(sa_key)
        public_key(sa_key, sa_pub)
        admin_token = secrets.token_urlsafe(32)
        tokens = os.path.join(d, "tokens.csv")
        with open(os.open(tokens, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(f"{admin_token},leaderd-test-admin,leaderd-test-admin,system:masters\n")
        port = free_port()
        args = [
            str(self.bin / "kube-apiserver"),
            f"--etcd-servers={self.etcd.endpoints}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={port}", f"--cert-dir={d}",
            f"--tls-cert-file={cert}", f"--tls-private-key-file={key}",
            f"--token-auth-file={tokens}", "--authorization-mode=RBAC",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            # Cluster IPs are only allocated in the API, never routed: no traffic goes there.
            "--service-cluster-ip-range=10.96.0.0/24",
            # The "kubernetes" Service's endpoints may not be loopback: do not maintain them.
            "--endpoint-reconciler-type=none",
            "--profiling=false", "--enable-logs-handler=false",
        ]  # fmt: skip
        self._args = args
        self.start_server()
        return Client(f"https://127.0.0.1:{port}", ca[0], admin_token)

    def start_server(self) -> None:
        """Start kube-apiserver (again, after kill_server) with the same flags and state."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self._args, stdout=log, stderr=subprocess.STDOUT)

    def kill_server(self) -> None:
        """SIGKILL kube-apiserver; etcd, and so every object, stays."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until /readyz answers ok: etcd reached, built-in roles and API groups set up."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                raise ControlPlaneError(f"kube-apiserver exited: {self.log_tail()}")
            try:
                if self.admin.request("GET", "/readyz").status == 200:
                    return
            except OSError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"not ready in {timeout:g}s: {self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 15) -> str:
        """The server's last log lines (its workdir is gone once the fixture fails)."""
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def _set_up_namespace(self) -> Client:
        """NAMESPACE, its ServiceAccount bound to ROLE_RULES, and that account's client."""
        ns = f"/api/v1/namespaces/{NAMESPACE}"
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}"
        meta = {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
        self.admin.ok("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        self.admin.ok("POST", f"{ns}/serviceaccounts", {"metadata": meta})
        self.admin.ok("POST", f"{rbac}/roles", {"metadata": meta, "rules": ROLE_RULES})
        self.admin.ok("POST", f"{rbac}/rolebindings", role_binding())
        request = {"spec": {"expirationSeconds": 3600}}
        grant = self.admin.ok("POST", f"{ns}/serviceaccounts/{SERVICE_ACCOUNT}/token", request)
        return Client(self.admin.server, self.admin.cacert, grant["status"]["token"])

    def cleanup(self) -> None:
        self.kill_server()
        if self.etcd is not None:
            self.etcd.cleanup()
        shutil.rmtree(self.workdir, ignore_errors=True)
