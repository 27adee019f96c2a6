"""The client-go elector (tests/backends/kubernetes/elector) as a process of a test: its transition
lines are collected as they are printed, each with the time it was read."""

from __future__ import annotations

import math
import signal
import subprocess
import threading
import time
from pathlib import Path

from tests.support.kube_cluster import NAMESPACE, ControlPlane

LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"


class Elector:
    """One elector process; client-go's LeaseDuration/RenewDeadline/RetryPeriod as given."""

    def __init__(
        self,
        kube: ControlPlane,
        lease: str,
        identity: str,
        workdir: Path,
        timing: tuple[str, str, str] = ("600s", "10s", "500ms"),
    ) -> None:
        self.identity = identity
        kubeconfig = kube.restricted.kubeconfig(str(workdir / "restricted.kubeconfig"))
        duration, deadline, retry = timing
        args = [
            kube.elector, "-kubeconfig", kubeconfig, "-namespace", NAMESPACE,
            "-lease", lease, "-identity", identity,
            "-lease-duration", duration, "-renew-deadline", deadline, "-retry-period", retry,
        ]  # fmt: skip
        with open(workdir / f"{identity}.log", "ab") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
        self.lines: list[str] = []
        self.read_at: list[float] = []  # time.monotonic() each line was read
        self.sigterm_at = math.inf
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.read_at.append(time.monotonic())
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

    def terminate(self) -> None:
        """SIGTERM: client-go's context ends at once (the app stops leading), then it
        releases the Lease (ReleaseOnCancel) and prints "stopped"."""
        self.sigterm_at = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)

    def leading(self) -> list[tuple[float, float]]:
        """Spans (time.monotonic()) within which this elector surely led: from reading
        "leading" to the earlier of SIGTERM and reading "stopped" (or now, if neither)."""
        spans, start = [], None
        for line, at in zip(list(self.lines), list(self.read_at), strict=False):
            if line == "leading":
                start = at
            elif line == "stopped" and start is not None:
                spans.append((start, min(at, self.sigterm_at)))
                start = None
        if start is not None:
            spans.append((start, min(time.monotonic(), self.sigterm_at)))
        return spans

    def wait_exit(self) -> int:
        """The exit status, once every line printed has been read."""
        status = self.proc.wait(30)
        self.reader.join(30)
        return status

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def holder(kube: ControlPlane, lease: str) -> tuple[str, int]:
    spec = kube.admin.ok("GET", f"{LEASES}/{lease}")["spec"]
    return spec.get("holderIdentity", ""), spec.get("leaseTransitions", 0)
