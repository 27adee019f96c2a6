"""A virtual IP moved by transition hooks (docs/run.md, "Transition hooks"): three daemons,
each in a network namespace the test makes, whose hooks `ip addr add/del` one address. A
client namespace reaches the three over a bridge. A referee samples, all along, which
namespaces hold the address and which daemons answer leader: never two holders that both
answer leader. After each failover (SIGTERM, SIGKILL of a whole "host", a frozen leader)
the address is on the new leader and a client through it reaches the new leader's server.
Needs root (network namespaces)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest

from tests.support.daemons import Daemon, frozen_outside_a_write, short_tempdir, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and ip"),
]

VIP = "10.77.0.100"
TTL = 2.0
# The server of each namespace: its node id, on port 8080 of every address it has.
SERVER = """
import http.server, sys
node = sys.argv[1].encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(node)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""


def ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=10)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr.strip()}"
    return done.stdout


class Net:
    """A client namespace with a bridge, and one namespace per node on it."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.client = f"ldk{self.tag}"
        self.nodes: dict[str, str] = {}
        ip("netns", "add", self.client)
        ip("-n", self.client, "link", "set", "lo", "up")
        ip("-n", self.client, "link", "add", "br0", "type", "bridge")
        ip("-n", self.client, "addr", "add", "10.77.0.1/24", "dev", "br0")
        ip("-n", self.client, "link", "set", "br0", "up")

    def add(self, node: str, host: int) -> str:
        ns = f"ld{node[-1]}{self.tag}"
        ip("netns", "add", ns)
        inner, outer = f"i{node[-1]}{self.tag}", f"o{node[-1]}{self.tag}"
        ip("link", "add", inner, "type", "veth", "peer", "name", outer)
        ip("link", "set", inner, "netns", ns)
        ip("link", "set", outer, "netns", self.client)
        ip("-n", ns, "link", "set", inner, "name", "eth0")
        ip("-n", ns, "addr", "add", f"10.77.0.{host}/24", "dev", "eth0")
        for link in ("lo", "eth0"):
            ip("-n", ns, "link", "set", link, "up")
        ip("-n", self.client, "link", "set", outer, "master", "br0")
        ip("-n", self.client, "link", "set", outer, "up")
        self.nodes[node] = ns
        return ns

    def holders(self, order: list[str] | None = None) -> set[str]:
        names = order or list(self.nodes)
        return {n for n in names if f" {VIP}/" in ip("-n", self.nodes[n], "-o", "addr")}

    def holding_throughout(self) -> set[str]:
        """The namespaces that held the address all through two reads, the second in the
        other order: one read after another cannot show a move from one namespace to the
        next as both holding it (the first is read before it drops it, the second after)."""
        names = list(self.nodes)
        return self.holders(names) & self.holders(names[::-1])

    def reach(self) -> str:
        """Through the address, from the client namespace (a fresh neighbour lookup)."""
        ip("-n", self.client, "neigh", "flush", "all")
        done = subprocess.run(
            ["ip", "netns", "exec", self.client, "curl", "-s", "--max-time", "1",
             f"http://{VIP}:8080/"], capture_output=True, text=True, check=False, timeout=10,
        )  # fmt: skip
        return done.stdout

    def cut(self, node: str) -> None:
        """The host is gone: its link is down."""
        ip("-n", self.nodes[node], "link", "set", "eth0", "down")

    def close(self) -> None:
        for ns in [*self.nodes.values(), self.client]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


class Referee(threading.Thread):
    """Samples holders and leaders until stopped; collects any instant with two holders
    that both answer leader."""

    def __init__(self, net: Net, daemons: dict[str, Daemon]) -> None:
        super().__init__(daemon=True)
        self.net, self.daemons = net, daemons
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.phase = "start"  # what the test is doing, for the report
        self.samples = 0

    def run(self) -> None:
        while not self.stop.is_set():
            frozen = set(stopped)  # as the sample begins: the test may thaw one meanwhile
            before = self.answering_leader()
            holders = self.net.holding_throughout()
            after = self.answering_leader()
            frozen |= stopped
            both = holders & before & after
            if len(both) > 1:
                self.violations.append(f"{sorted(both)} hold {VIP} and answer leader")
            live = holders - frozen  # a frozen or dead host keeps it: no hook can run there
            if len(live) > 1 and not holders & frozen:
                self.violations.append(f"{sorted(live)} hold {VIP} at once ({self.phase})")
            self.samples += 1

    def answering_leader(self) -> set[str]:
        """Who answers leader now; a frozen daemon answers nothing (a short timeout)."""
        daemons = list(self.daemons.values())
        return {d.node_id for d in daemons if d.alive() and d.get("/leader", 0.3)[0] == 200}


@pytest.fixture
def net() -> Iterator[Net]:
    n = Net()
    yield n
    n.close()


def start(net: Net, workdir: str, node: str, host: int) -> Daemon:
    ns = net.add(node, host)
    server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SERVER, node])
    servers.append(server)
    hooks = ("--on-elected", f"ip addr add {VIP}/24 dev eth0",
             "--on-demoted", f"sh -c 'sleep 0.2; ip addr del {VIP}/24 dev eth0'",
             "--hook-timeout", "0.5")  # fmt: skip
    d = Daemon(node, f"sqlite://{workdir}/lease.db", workdir=workdir, ttl=TTL,
               extra_args=hooks)  # fmt: skip
    d.args = ["ip", "netns", "exec", ns, *d.args]
    return d.start()


servers: list[subprocess.Popen[bytes]] = []


def settled(net: Net, daemons: dict[str, Daemon], reach: bool = True) -> str:
    """The one leader, once it alone of the live hosts holds the address and (``reach``) a
    client through the address reaches its server. While a frozen host still holds it too,
    its kernel answers the client's neighbour lookups as well: who gets the client is then
    a race, which only the frozen host's thaw (or its death) ends."""

    def one() -> str | None:
        found = [n for n, d in daemons.items() if d.alive() and d.get("/leader", 0.3)[0] == 200]
        if len(found) != 1:
            return None
        leader = found[0]
        live = {n for n in net.holders() if daemons[n].alive() and n not in stopped}
        return leader if live == {leader} and (not reach or net.reach() == leader) else None

    leader: str = wait_for(one, timeout=20, interval=0.1, what="the address on the leader")
    return leader


stopped: set[str] = set()


def test_a_virtual_ip_follows_the_leader_across_sigterm_sigkill_and_a_freeze(
    net: Net,
) -> None:
    workdir = short_tempdir("ld-vip-")
    daemons = {n: start(net, workdir, n, h) for n, h in (("node-a", 11), ("node-b", 12),
                                                       ("node-c", 13))}  # fmt: skip
    referee = Referee(net, daemons)
    try:
        first = settled(net, daemons)
        referee.start()
        # Frozen: it can run no hook, so it keeps the address while another node takes over
        # after one ttl; it answers nothing meanwhile, and steps down once thawed.
        referee.phase = f"{first} frozen"
        frozen_outside_a_write(daemons[first])
        stopped.add(first)
        second = settled(net, daemons, reach=False)
        assert first in net.holders()
        referee.phase = f"{first} thawed"
        daemons[first].signal(signal.SIGCONT)
        wait_for(lambda: first not in net.holders(), timeout=10, what="the thawed one to drop it")
        stopped.discard(first)
        assert settled(net, daemons) == second
        # A graceful hand-over: the demote hook drops the address before the release.
        referee.phase = f"{second} stopped by SIGTERM"
        daemons[second].signal(signal.SIGTERM)
        assert daemons[second].wait() == 0
        assert second not in net.holders()
        del daemons[second]
        third = settled(net, daemons)
        # A host that dies: leaderd killed, its link down; its address goes with it.
        referee.phase = f"{third} killed"
        daemons[third].kill()
        net.cut(third)
        stopped.add(third)
        last = settled(net, daemons)
        assert last != third
    finally:
        referee.stop.set()
        if referee.is_alive():
            referee.join(10)
        for d in daemons.values():
            d.kill()
        for s in servers:
            s.kill()
            s.wait()
        servers.clear()
        stopped.clear()
        shutil.rmtree(workdir, ignore_errors=True)
    assert referee.samples >= 5  # it sampled all along (each sample: a few curl and ip calls)
    assert not referee.violations, referee.violations[:5]
