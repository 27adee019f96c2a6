"""client-go's own leader election (tests/kubernetes/elector) runs against the test control
plane: two electors on one Lease, exactly one leads, and SIGTERM hands the Lease over."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kubernetes.cluster import NAMESPACE, ControlPlane

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow]

LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"


class Elector:
    """One elector process; its transition lines are collected as they are printed."""

    def __init__(self, kube: ControlPlane, lease: str, identity: str, workdir: Path) -> None:
        self.identity = identity
        kubeconfig = kube.restricted.kubeconfig(str(workdir / "restricted.kubeconfig"))
        args = [
            kube.elector, "-kubeconfig", kubeconfig, "-namespace", NAMESPACE,
            "-lease", lease, "-identity", identity,
            "-lease-duration", "600s", "-renew-deadline", "10s", "-retry-period", "500ms",
        ]  # fmt: skip
        with open(workdir / f"{identity}.log", "ab") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def wait_line(self, prefix: str, timeout: float = 60.0) -> str:
        """The first line starting with prefix, once printed."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self.reader.join(30)  # every line it printed is read
            found = [line for line in self.lines if line.startswith(prefix)]
            if found:
                return found[0]
            assert self.proc.poll() is None, f"{self.identity} exited: {self.lines}"
            assert time.monotonic() < deadline, f"{self.identity}: no {prefix!r} in {self.lines}"
            time.sleep(0.05)

    def wait_exit(self) -> int:
        """The exit status, once every line printed has been read."""
        status = self.proc.wait(30)
        self.reader.join(30)
        return status


@pytest.fixture
def electors() -> Iterator[list[Elector]]:
    started: list[Elector] = []
    yield started
    for elector in started:
        if elector.proc.poll() is None:
            elector.proc.kill()
        elector.proc.wait(30)


def holder(kube: ControlPlane, lease: str) -> tuple[str, int]:
    spec = kube.admin.ok("GET", f"{LEASES}/{lease}")["spec"]
    return spec.get("holderIdentity", ""), spec.get("leaseTransitions", 0)


def test_one_leads_and_sigterm_hands_over(
    kube: ControlPlane, electors: list[Elector], tmp_path: Path
) -> None:
    a, b = (Elector(kube, "client-go", name, tmp_path) for name in ("elector-a", "elector-b"))
    electors += [a, b]
    # Both see the same holder, and only that one says it leads.
    seen = {a.wait_line("leader "), b.wait_line("leader ")}
    assert len(seen) == 1
    leader, standby = (a, b) if seen == {"leader elector-a"} else (b, a)
    leader.wait_line("leading")
    assert "leading" not in standby.lines
    assert holder(kube, "client-go") == (leader.identity, 0)

    # The Lease lasts 600 s: the standby can lead within the wait only if SIGTERM released it.
    os.kill(leader.proc.pid, signal.SIGTERM)
    assert leader.wait_exit() == 0
    assert leader.lines[-1] == "stopped"
    standby.wait_line("leading")
    assert holder(kube, "client-go") == (standby.identity, 1)
