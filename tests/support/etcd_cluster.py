"""A throwaway etcd cluster for tests and the benchmark: Debian's etcd 3.4 on loopback.

``EtcdCluster(3)`` starts three members on free 127.0.0.1 ports in a temporary directory and
waits until they have a raft leader. Members can be stopped, killed, paused (SIGSTOP) and
started again; ``url()`` is a leaderd backend URL naming every member (or some of them).

Raft runs faster than etcd's defaults (heartbeat 50 ms, election timeout 500 ms) so that
leader changes take a fraction of a second; etcd's shortest lease is then 1 s (its minimum
is 1.5 election timeouts, rounded up to whole seconds). ``raft_defaults=True`` keeps etcd's
own timing (heartbeat 100 ms, election 1 s: shortest lease 2 s), as the benchmark does.
Members do not fsync (``--unsafe-no-fsync``, like the tests' PostgreSQL): a member's process
restart loses nothing, since its writes are in the host's page cache.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

INSTALL = "apt-get install -y etcd-server etcd-client"


class EtcdClusterError(RuntimeError):
    """The cluster could not be set up or did not become healthy; the message says why."""


def missing() -> str | None:
    """Why no etcd can be started here, or None."""
    absent = [b for b in ("etcd", "etcdctl") if shutil.which(b) is None]
    return f"{' and '.join(absent)} not installed ({INSTALL})" if absent else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Member:
    name: str
    client_url: str
    peer_url: str
    args: list[str]
    log_path: str
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def hostport(self) -> str:
        return self.client_url.split("://", 1)[1]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Tls:
    """TLS on every member's client URL, client certificates required: PEM paths
    (tests/support/tls.py makes them)."""

    cert: str
    key: str
    cacert: str  # the CA of the server's certificate and of the client certificates
    client_cert: str  # what the cluster's own requests present
    client_key: str

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.cacert)
        context.load_cert_chain(self.client_cert, self.client_key)
        return context


@dataclass
class EtcdCluster:
    size: int = 3
    tls: Tls | None = None
    raft_defaults: bool = False
    fsync: bool = False
    extra_args: Sequence[str] = ()
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="ld-etcd-", dir="/tmp"))
    members: list[Member] = field(default_factory=list)

    def __post_init__(self) -> None:
        reason = missing()
        if reason:
            raise EtcdClusterError(reason)
        scheme = "https" if self.tls else "http"
        ports = [(free_port(), free_port()) for _ in range(self.size)]
        peers = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, (_, p) in enumerate(ports))
        token = f"leaderd-test-{os.getpid()}-{time.monotonic_ns()}"
        for i, (client_port, peer_port) in enumerate(ports):
            client, peer = f"{scheme}://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
            args = [
                "etcd", "--name", f"m{i}", "--data-dir", os.path.join(self.workdir, f"m{i}"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", peers, "--initial-cluster-token", token,
                "--initial-cluster-state", "new", "--logger", "zap", "--log-level", "warn",
            ]  # fmt: skip
            if not self.raft_defaults:
                args += ["--heartbeat-interval", "50", "--election-timeout", "500"]
            if not self.fsync:
                args.append("--unsafe-no-fsync")
            args += self.extra_args
            if self.tls:
                args += ["--cert-file", self.tls.cert, "--key-file", self.tls.key,
                         "--client-cert-auth", "--trusted-ca-file", self.tls.cacert]  # fmt: skip
            log_path = os.path.join(self.workdir, f"m{i}.log")
            self.members.append(Member(f"m{i}", client, peer, args, log_path))
        try:
            for member in self.members:
                self.start(member, wait=False)
            self.wait_healthy()
        except BaseException:
            self.cleanup()
            raise

    # ---- URLs ----

    def url(
        self, prefix: str = "/leaderd/", members: Sequence[Member] | None = None, **params: str
    ) -> str:
        """A leaderd backend URL for these members (default: all), in this order."""
        hosts = ",".join(m.hostport for m in (members or self.members))
        scheme = "etcd+https" if self.tls else "etcd"
        query = "&".join(f"{k}={v}" for k, v in {"prefix": prefix, **params}.items())
        return f"{scheme}://{hosts}/?{query}"

    @property
    def endpoints(self) -> str:
        return ",".join(m.client_url for m in self.members)

    # ---- members ----

    def start(self, member: Member, wait: bool = True) -> None:
        if member.running():
            return
        with open(member.log_path, "ab") as log:
            member.proc = subprocess.Popen(member.args, stdout=log, stderr=subprocess.STDOUT)
        member.paused = False
        if wait:
            self.wait_member(member)

    def stop(self, member: Member) -> None:
        """SIGTERM: a graceful stop (a leader hands raft leadership over first)."""
        self.resume(member)
        if member.running():
            assert member.proc is not None
            member.proc.terminate()
            member.proc.wait(30)

    def kill(self, member: Member) -> None:
        self.resume(member)
        if member.running():
            assert member.proc is not None
            member.proc.kill()
            member.proc.wait(30)

    def pause(self, member: Member) -> None:
        if member.running():
            assert member.proc is not None
            os.kill(member.proc.pid, signal.SIGSTOP)
            member.paused = True

    def resume(self, member: Member) -> None:
        if member.paused and member.running():
            assert member.proc is not None
            os.kill(member.proc.pid, signal.SIGCONT)
        member.paused = False

    def ensure_running(self) -> None:
        """Every member up and the cluster healthy (after a test that stopped some)."""
        for member in self.members:
            self.resume(member)
            self.start(member, wait=False)
        self.wait_healthy()

    def cleanup(self) -> None:
        for member in self.members:
            self.kill(member)
        shutil.rmtree(self.workdir, ignore_errors=True)

    # ---- asking the members ----

    def post(self, member: Member, path: str, body: dict[str, Any], timeout: float = 2.0) -> Any:
        """One gateway request to one member (with the client certificate on TLS clusters)."""
        request = urllib.request.Request(
            member.client_url + path, data=json.dumps(body).encode(), method="POST"
        )
        context = self.tls.context() if self.tls else None
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return json.loads(response.read() or b"{}")

    def status(self, member: Member) -> dict[str, Any] | None:
        """The member's /v3/maintenance/status, or None if it does not answer."""
        if not member.running() or member.paused:
            return None
        try:
            answer: dict[str, Any] = self.post(member, "/v3/maintenance/status", {}, timeout=1.0)
        except (OSError, urllib.error.URLError, ValueError):
            return None
        return answer

    def leader(self) -> Member | None:
        """The member that is raft leader, as the live members agree; None without one."""
        by_id: dict[str, Member] = {}
        leaders = set()
        for member in self.members:
            status = self.status(member)
            if status and status.get("leader") and status.get("leader") != "0":
                by_id[status["header"]["member_id"]] = member
                leaders.add(status["leader"])
        if len(leaders) != 1:
            return None
        return by_id.get(leaders.pop())

    def wait_member(self, member: Member, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.status(member) is None:
            if member.proc is not None and member.proc.poll() is not None:
                raise EtcdClusterError(f"etcd {member.name} exited; see {member.log_path}")
            if time.monotonic() > deadline:
                raise EtcdClusterError(f"etcd {member.name} did not answer in {timeout:g}s")
            time.sleep(0.05)

    def wait_healthy(self, timeout: float = 60.0) -> Member:
        """Until the live members agree on a raft leader and a write goes through."""
        deadline = time.monotonic() + timeout
        while True:
            leader = self.leader()
            if leader is not None and self._write_ok(leader):
                return leader
            if time.monotonic() > deadline:
                raise EtcdClusterError(
                    f"etcd cluster not healthy after {timeout:g}s ({self.workdir})"
                )
            time.sleep(0.05)

    def _write_ok(self, member: Member) -> bool:
        body = {"key": base64.b64encode(b"/leaderd-test/health").decode(), "value": ""}
        try:
            self.post(member, "/v3/kv/put", body, timeout=2.0)
        except (OSError, urllib.error.URLError, ValueError):
            return False
        return True

    def get(self, key: str) -> tuple[bytes | None, dict[str, Any]]:
        """A key's value (None if absent) and its kv record, from any live member."""
        body = {"key": base64.b64encode(key.encode()).decode()}
        for member in self.members:
            if self.status(member) is not None:
                answer = self.post(member, "/v3/kv/range", body)
                kvs = answer.get("kvs", [])
                if not kvs:
                    return None, {}
                return base64.b64decode(kvs[0].get("value", "")), kvs[0]
        raise EtcdClusterError("no etcd member answers")

    def etcdctl(self, *args: str, env: dict[str, str] | None = None) -> str:
        """Run etcdctl (API v3) against every member; its stdout."""
        out = subprocess.run(
            ["etcdctl", f"--endpoints={self.endpoints}", *args],
            capture_output=True, text=True, timeout=30, check=False,
            env={**os.environ, "ETCDCTL_API": "3", **(env or {})},
        )  # fmt: skip
        if out.returncode != 0:
            raise EtcdClusterError(f"etcdctl {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout
