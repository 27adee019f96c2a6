"""Faults of the control plane under three daemons on kubernetes://: the API server killed
and restarted, frozen (SIGSTOP), etcd under it stopped, the daemons' permissions revoked
(403), and their token no longer accepted (401, as an expired one is). Each fails
closed: the leader steps down by its deadline, nobody leads while the fault lasts, a leader
is back once it heals, and the referee sees at most one leader throughout."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.backends.kubernetes.referee import MixedReferee
from tests.support.daemons import Daemon, leaders, wait_for
from tests.support.kube_cluster import NAMESPACE, SERVICE_ACCOUNT, ControlPlane, role_binding

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow, pytest.mark.timeout(240)]

TTL = 3.0
BINDING = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings"


def killed(kube: ControlPlane, token: Path) -> Callable[[], None]:
    kube.kill_server()

    def heal() -> None:
        kube.start_server()
        kube.wait_ready()

    return heal


def frozen(kube: ControlPlane, token: Path) -> Callable[[], None]:
    assert kube.proc is not None
    pid = kube.proc.pid
    os.kill(pid, signal.SIGSTOP)
    return lambda: os.kill(pid, signal.SIGCONT)


def etcd_stopped(kube: ControlPlane, token: Path) -> Callable[[], None]:
    """etcd under the API server stops: it answers, with errors and timeouts."""
    assert kube.etcd is not None
    etcd, member = kube.etcd, kube.etcd.members[0]
    etcd.stop(member)

    def heal() -> None:
        etcd.start(member)
        kube.wait_ready()

    return heal


def forbidden(kube: ControlPlane, token: Path) -> Callable[[], None]:
    """The RoleBinding goes: every request of the daemons' service account is 403."""
    kube.admin.ok("DELETE", f"{BINDING}/{SERVICE_ACCOUNT}")
    return lambda: kube.admin.ok("POST", BINDING, role_binding())


def unauthorized(kube: ControlPlane, token: Path) -> Callable[[], None]:
    """The token file the daemons read (a kubeconfig's tokenFile, as a projected service
    account token is) holds a token the API server no longer accepts: every request is 401,
    as with an expired token, until the file holds a valid one again."""
    valid = token.read_text()
    _replace(token, "expired-" + uuid.uuid4().hex)
    return lambda: _replace(token, valid)


def _replace(path: Path, text: str) -> None:
    """Write ``text`` as the kubelet rotates a projected token: a new file renamed over."""
    staged = path.with_suffix(".new")
    staged.write_text(text)
    os.replace(staged, path)


@pytest.mark.parametrize(
    "fault", [killed, frozen, etcd_stopped, forbidden, unauthorized], ids=lambda f: f.__name__
)
def test_a_control_plane_fault_fails_closed(
    kube: ControlPlane,
    fault: Callable[[ControlPlane, Path], Callable[[], None]],
    tmp_path: Path,
    workdir: str,
) -> None:
    kubeconfig = kube.restricted.kubeconfig(str(tmp_path / "daemon.kubeconfig"))
    token = tmp_path / "token"
    token.write_text(token_file_instead(kubeconfig))
    url = f"kubernetes:///{NAMESPACE}?lease-prefix=f{uuid.uuid4().hex[:8]}-&kubeconfig={kubeconfig}"
    daemons = [
        Daemon(f"node-{i}", url, workdir=workdir, ttl=TTL, renew_interval=0.75,
               retry_interval=0.25).start()
        for i in range(3)
    ]  # fmt: skip
    with MixedReferee(daemons, []) as referee:
        for d in daemons:
            d.wait_ready(30)
        leader = wait_for(lambda: leaders(daemons), timeout=30, what="a leader")[0]
        referee.wait_seen(leader)
        heal = fault(kube, token)
        try:
            wait_for(lambda: not leaders(daemons), timeout=TTL + 5, what="the leader to step down")
            quiet_until = time.monotonic() + TTL  # a ttl more with nobody leading
            while time.monotonic() < quiet_until:
                assert not leaders(daemons)
                time.sleep(0.1)
        finally:
            heal()
        wait_for(lambda: leaders(daemons), timeout=60, what="a leader once healed")
    assert "stepping down from election default" in leader.log()


def token_file_instead(kubeconfig: str) -> str:
    """Make ``kubeconfig`` name a tokenFile beside it instead of its inline token, which it
    returns (for that file)."""
    config = json.loads(Path(kubeconfig).read_text())
    user = config["users"][0]["user"]
    token = user.pop("token")
    user["tokenFile"] = str(Path(kubeconfig).parent / "token")
    Path(kubeconfig).write_text(json.dumps(config))
    return str(token)
