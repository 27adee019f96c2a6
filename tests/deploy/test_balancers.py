"""The balancer recipes of docs/deployment.md, run as written by Debian's HAProxy and nginx.

Three nodes on loopback addresses (127.0.0.11-13), each with a leaderd (SQLite, read-only
listener) and an app that answers 200 with its node id while its leaderd says it leads,
503 otherwise (asked over the Unix socket on every request, as the docs advise). The
recipes' addresses and ports are swapped for these; a client sends a steady stream of
POSTs through the balancer while the leader is stopped (SIGTERM: a graceful handover).
"""

from __future__ import annotations

import http.client
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.daemons import Daemon, leaders, short_tempdir, wait_for

from ._tools import ROOT, require, run

pytestmark = pytest.mark.deploy

DOCS = ROOT / "docs" / "deployment.md"
FRONTEND = "127.0.0.10"
NODES = {"node-a": ("10.0.0.5", "127.0.0.11"), "node-b": ("10.0.0.6", "127.0.0.12"),
         "node-c": ("10.0.0.7", "127.0.0.13")}  # fmt: skip


def recipe(language: str) -> str:
    """The fenced block of that language in docs/deployment.md."""
    found = re.findall(rf"```{language}\n(.*?)```", DOCS.read_text(), re.S)
    assert len(found) == 1, f"expected one ```{language} block in {DOCS}"
    return str(found[0])


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LeaderdConnection(http.client.HTTPConnection):
    """HTTP over leaderd's Unix socket."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=1)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def leads(daemon: Daemon) -> bool:
    """GET /leader on the daemon's socket: 200 while it leads; no answer is not leading."""
    conn = LeaderdConnection(daemon.socket)
    try:
        conn.request("GET", "/leader")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


class App(BaseHTTPRequestHandler):
    """The node's app: writes are taken only while its leaderd leads."""

    daemon: Daemon  # set on each node's subclass

    def leading(self) -> bool:
        return leads(self.daemon)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        leading = self.leading()
        body = self.daemon.node_id.encode() if leading else b"not the leader"
        self.send_response(200 if leading else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class BlindApp(App):
    """An app that takes every write: only the balancer's health check guards it."""

    def leading(self) -> bool:
        return True


@dataclass
class Cluster:
    """Three nodes: leaderd + app each. Ports are the same on every node's address."""

    workdir: str = field(default_factory=short_tempdir)
    app_port: int = field(default_factory=lambda: free_port("127.0.0.11"))
    listener_port: int = field(default_factory=lambda: free_port("127.0.0.11"))
    frontend_port: int = field(default_factory=lambda: free_port(FRONTEND))
    daemons: dict[str, Daemon] = field(default_factory=dict)
    servers: list[ThreadingHTTPServer] = field(default_factory=list)
    app: type[App] = App

    def start(self) -> Cluster:
        for name, (_, ip) in NODES.items():
            daemon = Daemon(name, f"sqlite://{self.workdir}/lease.db", workdir=self.workdir,
                            extra_args=["--listen", f"{ip}:{self.listener_port}"])  # fmt: skip
            self.daemons[name] = daemon.start()
            handler = type(f"App_{name}", (self.app,), {"daemon": daemon})
            server = ThreadingHTTPServer((ip, self.app_port), handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.servers.append(server)
        for daemon in self.daemons.values():
            daemon.wait_ready()
        wait_for(lambda: len(leaders(list(self.daemons.values()))) == 1, 10, what="a leader")
        return self

    def localize(self, config: str) -> str:
        """The recipe with this cluster's loopback addresses and ports."""
        for documented, ip in NODES.values():
            config = config.replace(documented, ip)
        config = config.replace(":8080", f":{self.app_port}")
        config = config.replace("port 4040", f"port {self.listener_port}")
        config = config.replace("bind :8000", f"bind {FRONTEND}:{self.frontend_port}")
        return config.replace("listen 8000;", f"listen {FRONTEND}:{self.frontend_port};")

    def stop(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
        for daemon in self.daemons.values():
            daemon.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


class Stream:
    """A steady stream of POSTs through the balancer: (time, status, node that took it)."""

    def __init__(self, port: int, every: float = 0.01) -> None:
        self.port, self.every = port, every
        self.answers: list[tuple[float, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            sent = time.monotonic()
            try:
                conn = http.client.HTTPConnection(FRONTEND, self.port, timeout=5)
                conn.request("POST", "/jobs", body=b"{}")
                answer = conn.getresponse()
                status, body = answer.status, answer.read().decode()
                conn.close()
            except (OSError, http.client.HTTPException) as exc:
                # Refused, or cut off mid-answer (a balancer that ends the sessions of a
                # server it marks down): either way a write not taken.
                status, body = 0, str(exc) or type(exc).__name__
            self.answers.append((sent, status, body))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    nodes = Cluster()
    try:
        yield nodes.start()
    finally:
        nodes.stop()


@dataclass
class Switch:
    """Seconds from the old leader's SIGTERM to the first write the new leader took, to the
    last write refused (after which every write went to the new leader), and to the new
    leader seen leading (its /leader answered 200 by then)."""

    first: float
    settled: float
    led: float


def handover(cluster: Cluster, stream: Stream, watch: float) -> Switch:
    """Stop the leader gracefully under the stream, and follow the stream for `watch` s."""
    wait_for(lambda: len(stream.answers) > 50, 10, what="the stream to flow")
    old = leaders(list(cluster.daemons.values()))[0]
    before = [who for _, code, who in stream.answers[-20:] if code == 200]
    assert before and set(before) == {old.node_id}, stream.answers[-20:]
    stopped = time.monotonic()
    old.signal(signal.SIGTERM)
    others = [d for d in cluster.daemons.values() if d is not old]
    new = wait_for(lambda: leaders(others), 5, what="a new leader")[0]
    led = time.monotonic() - stopped
    time.sleep(max(0.0, stopped + watch - time.monotonic()))
    stream.stop()
    assert old.wait() == 0
    after = [(t - stopped, code, who) for t, code, who in stream.answers if t >= stopped]
    assert {who for _, code, who in after if code == 200} == {new.node_id}, after
    first = next((t for t, code, _ in after if code == 200), watch)
    settled = max((t for t, code, _ in after if code != 200), default=0.0)
    assert sum(1 for t, _, _ in after if t > settled) > 10, f"not settled in {watch}s: {after}"
    refused = sum(1 for _, code, _ in after if code != 200)
    print(f"\nhandover {old.node_id} -> {new.node_id} (SIGTERM): first write to the new "
          f"leader after {first * 1000:.0f} ms, last write refused after {settled * 1000:.0f} "
          f"ms; {refused} of {len(after)} writes refused")  # fmt: skip
    return Switch(first, settled, led)


def haproxy_config(cluster: Cluster, prefix: Path, backend: str) -> Path:
    """HAProxy's configuration: Debian's defaults, a stats socket in ``prefix``, and
    ``backend`` (a recipe) localized to the cluster."""
    config = prefix / "haproxy.cfg"
    config.write_text(
        f"global\n    maxconn 256\n    stats socket {prefix}/stats.sock\n\n"
        # As Debian's /etc/haproxy/haproxy.cfg sets them.
        "defaults\n    mode http\n    timeout connect 5000\n    timeout client 50000\n"
        "    timeout server 50000\n\n" + cluster.localize(backend)
    )
    run([require("haproxy"), "-c", "-f", config])
    return config


def servers_up(stats: Path) -> set[str]:
    """The servers HAProxy marks UP, from `show stat` on its stats socket."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(stats))
        s.sendall(b"show stat\n")
        answer = b"".join(iter(lambda: s.recv(65536), b"")).decode()
    rows = [line.split(",") for line in answer.splitlines() if line and line[0] != "#"]
    return {row[1] for row in rows if row[1] in NODES and row[17] == "UP"}


def test_haproxy_recipe_routes_writes_to_the_leader(cluster: Cluster, tmp_path: Path) -> None:
    config = haproxy_config(cluster, tmp_path, recipe("haproxy"))
    proxy = subprocess.Popen([require("haproxy"), "-db", "-f", config], stderr=subprocess.PIPE)
    try:
        wait_for(lambda: up(cluster.frontend_port), 10, what="haproxy to listen")
        switch = handover(cluster, Stream(cluster.frontend_port), watch=3)
        # HAProxy checks each node every second (inter 1s): by then the old leader is
        # marked down and the new one up (allowing for a check's own time on a busy machine).
        assert switch.first < 2.5 and switch.settled < 2.5, switch
    finally:
        proxy.terminate()
        proxy.wait(10)


@pytest.fixture
def blind_cluster() -> Iterator[Cluster]:
    nodes = Cluster(app=BlindApp)
    try:
        yield nodes.start()
    finally:
        nodes.stop()


def test_haproxy_options_check_marks_only_the_leader_up(
    blind_cluster: Cluster, tmp_path: Path
) -> None:
    """Patroni's recipes check with OPTIONS: it must answer like GET, or every node is UP
    and an app that trusts its balancer takes writes on a follower."""
    documented = recipe("haproxy")
    patroni_style = documented.replace(
        "option httpchk GET /leader", "option httpchk OPTIONS /leader"
    )
    assert patroni_style != documented
    config = haproxy_config(blind_cluster, tmp_path, patroni_style)
    proxy = subprocess.Popen([require("haproxy"), "-db", "-f", config])
    try:
        wait_for(lambda: up(blind_cluster.frontend_port), 10, what="haproxy to listen")
        leader = leaders(list(blind_cluster.daemons.values()))[0].node_id
        stats = tmp_path / "stats.sock"
        wait_for(lambda: servers_up(stats) == {leader}, 10, what=f"only {leader} UP")
        stream = Stream(blind_cluster.frontend_port)
        wait_for(lambda: len(stream.answers) >= 100, 30, what="100 writes")
        stream.stop()
        assert {(code, who) for _, code, who in stream.answers} == {(200, leader)}
        assert servers_up(stats) == {leader}
    finally:
        proxy.terminate()
        proxy.wait(10)


def nginx_config(cluster: Cluster, prefix: Path, server_block: str) -> Path:
    config = prefix / "nginx.conf"
    config.write_text(
        f"pid {prefix}/nginx.pid;\nerror_log {prefix}/error.log;\nevents {{}}\n"
        f"http {{\n    access_log off;\n    client_body_temp_path {prefix}/body;\n"
        f"    proxy_temp_path {prefix}/proxy;\n{cluster.localize(server_block)}\n}}\n"
    )
    return config


@pytest.mark.parametrize("max_fails", ["0", "default"])
def test_nginx_recipe_routes_writes_to_the_leader(
    cluster: Cluster, tmp_path: Path, max_fails: str
) -> None:
    """As written, and without max_fails=0 (to show why the recipe needs it)."""
    nginx = require("nginx")
    block = recipe("nginx")
    fast = max_fails == "0"
    if not fast:
        block = block.replace(" max_fails=0;", ";")
    tmp_path.chmod(0o755)
    config = nginx_config(cluster, tmp_path, block)
    run([nginx, "-t", "-p", tmp_path, "-c", config])
    proxy = subprocess.Popen([nginx, "-p", tmp_path, "-c", config, "-g", "daemon off;"])
    try:
        wait_for(lambda: up(cluster.frontend_port), 10, what="nginx to listen")
        switch = handover(cluster, Stream(cluster.frontend_port), watch=2 if fast else 13)
        if fast:  # every write sent once the new leader led found it: none refused after
            assert switch.settled < switch.led, switch
        else:  # a follower's 503 took the next leader out of rotation for fail_timeout
            assert switch.first > 3, switch
    finally:
        proxy.terminate()
        proxy.wait(10)


def up(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((FRONTEND, port)) == 0
