"""The image built from the Dockerfile and run for real with podman, as root.

No registry can be reached, so the base image is made from Debian's packages by
packaging/debian-base-image.sh (debootstrap, about a minute, skipped when the image is in
the store already) and passed as the Dockerfile's BASE. Containers share the host's
network (loopback only) and get the socket and state directories as bind-mounted volumes,
so the host checks them as an app beside the container would: `curl --unix-socket`, the
probes on the TCP listener, the SQLite row.

What the host imposes, and what each setting here is for:
- storage: a store of its own with the vfs driver (works on any filesystem; the host's
  default store may be set up for another driver), kept between runs as a cache;
- runtime: runc. Debian 12's crun refuses a hybrid cgroup v1/v2 hierarchy ("cgroups in
  hybrid mode not supported"); runc runs on v1, hybrid and v2 alike;
- ulimits: podman asks the runtime for 1,048,576 open files by default, which root without
  CAP_SYS_RESOURCE (as in this sandbox) cannot grant: the limits are set explicitly.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sqlite3
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from tests.support.daemons import curl, short_tempdir, wait_for

from ._tools import ROOT, context_digest, require, run

# Building the base image and the image (up to 600 + 900 s of their own timeouts).
pytestmark = [pytest.mark.deploy, pytest.mark.timeout(1800)]

STORE = "/var/lib/leaderd-test/containers"
PODMAN_OPTIONS = [
    "--root", STORE, "--runroot", "/run/leaderd-test/containers", "--storage-driver", "vfs",
    "--runtime", "runc",
]  # fmt: skip
ULIMITS = ["--ulimit", "nofile=16384:16384", "--ulimit", "nproc=4096:4096"]
BASE = "localhost/leaderd-base:bookworm"
# Tagged by what it is built from (tests/deploy/_tools.py, context_digest): an image already in
# the store for this Dockerfile, build context and base is used as it is, as the kube-apiserver
# build is (tests/backends/kubernetes/build.sh); any change to them builds a new one.
IMAGE_REPO = "localhost/leaderd"
CA_BUNDLE = Path("/etc/ssl/certs")  # the host's trust store, for pip behind a TLS proxy


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    return run([require("podman"), *PODMAN_OPTIONS, *args], timeout=timeout, check=check).stdout


@pytest.fixture(scope="module")
def image() -> str:
    """The image, built from the Dockerfile on the Debian base; the base is made once."""
    if os.geteuid() != 0:
        pytest.fail("podman runs as root here: run the deploy tests as root", pytrace=False)
    for tool in ("podman", "debootstrap", "runc"):
        require(tool)
    run([ROOT / "packaging" / "debian-base-image.sh", BASE, "--", *PODMAN_OPTIONS], timeout=600)
    certs = ["--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"] if CA_BUNDLE.is_dir() else []
    base_id = podman("image", "inspect", "--format", "{{.Id}}", BASE).strip()
    image = f"{IMAGE_REPO}:ctx-{context_digest(base_id)}"
    if run([require("podman"), *PODMAN_OPTIONS, "image", "exists", image], check=False).returncode:
        build(image, certs)
    size = int(podman("image", "inspect", "--format", "{{.Size}}", image))
    print(f"\nimage {image}: {size / 1e6:.0f} MB on {BASE}")
    return image


def build(image: str, certs: list[str]) -> None:
    """podman build; then images of other contexts a day old go (the vfs store is large)."""
    started = time.monotonic()
    podman(
        "build", "--layers=false", "--network", "host", *certs, "--build-arg", f"BASE={BASE}",
        "--tag", image, "--file", str(ROOT / "Dockerfile"), str(ROOT), timeout=900,
    )  # fmt: skip
    print(f"\nimage {image}: built in {time.monotonic() - started:.0f}s")
    podman("image", "prune", "--force")
    old = podman("images", "--filter", f"reference={IMAGE_REPO}:ctx-*", "--filter", "until=24h",
                 "--format", "{{.Repository}}:{{.Tag}}").split()  # fmt: skip
    for name in old:
        if name != image:  # one still in use stays: rmi without --force refuses it
            podman("rmi", name, check=False)


@dataclass
class Container:
    """One leaderd container: its socket directory and the state directory it shares."""

    name: str
    image: str
    state: Path
    sockets: Path = field(default_factory=lambda: Path(short_tempdir("ld-pod-")))
    port: int = 0
    start_to_ready: float = 0.0

    @property
    def socket(self) -> str:
        return str(self.sockets / "leaderd.sock")

    def start(self) -> Container:
        self.port = free_port()
        for directory in (self.sockets, self.state):
            shutil.chown(directory, 10001, 10001)  # the image's numeric user
        started = time.monotonic()
        podman(
            "run", "--detach", "--name", self.name, "--hostname", self.name, "--network", "host",
            "--read-only", *ULIMITS, "--volume", f"{self.sockets}:/run/leaderd",
            "--volume", f"{self.state}:/var/lib/leaderd",
            self.image, "run", "--listen", f"127.0.0.1:{self.port}",
        )  # fmt: skip
        running = time.monotonic() - started  # the vfs driver copies the image's files first
        wait_for(lambda: self.probe("/ready") == 200, timeout=60, interval=0.05, what="/ready")
        self.start_to_ready = time.monotonic() - started
        print(f"\ncontainer {self.name}: podman run to /ready 200 in {self.start_to_ready:.2f}s "
              f"(podman run -d returned after {running:.2f}s; the daemon's first log line to "
              f"its ready line: {self.logged_start_to_ready():.3f}s)")  # fmt: skip
        return self

    def probe(self, path: str) -> int:
        """The status code of GET path on the TCP listener; 0 when nothing answers."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            return error.code
        except OSError:
            return 0

    def inspect(self, template: str) -> str:
        return podman("inspect", "--format", template, self.name).strip()

    def logs(self) -> str:
        """What the daemon wrote (podman logs replays its stderr on stderr)."""
        done = run([require("podman"), *PODMAN_OPTIONS, "logs", self.name], check=False)
        return done.stdout + done.stderr

    def logged_start_to_ready(self) -> float:
        """Seconds between the daemon's first log line and its "ready:" line."""
        stamps = re.findall(r"^(\S+)Z \S+ +(.*)$", self.logs(), re.M)
        ready = next(t for t, line in stamps if line.startswith("ready:"))
        start, end = (datetime.fromisoformat(t) for t in (stamps[0][0], ready))
        return (end - start).total_seconds()

    def remove(self) -> None:
        podman("rm", "--force", "--time", "0", self.name, check=False)
        shutil.rmtree(self.sockets, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lease_row(state: Path) -> tuple[str | None, int]:
    """(holder, term) of election default, read from the SQLite file on the volume."""
    with sqlite3.connect(state / "leaderd.db") as db:
        holder, term = db.execute(
            "SELECT holder, term FROM leaderd_lease WHERE election = 'default'"
        ).fetchone()
    return holder, int(term)


@pytest.fixture(scope="module")
def state() -> Iterator[Path]:
    """The state volume both containers share: one SQLite file, one kernel."""
    path = Path(short_tempdir("ld-state-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def first(image: str, state: Path) -> Iterator[Container]:
    box = Container(f"leaderd-a-{uuid.uuid4().hex[:6]}", image, state)
    try:
        yield box.start()
    finally:
        box.remove()


@pytest.fixture(scope="module")
def second(image: str, state: Path, first: Container) -> Iterator[Container]:
    box = Container(f"leaderd-b-{uuid.uuid4().hex[:6]}", image, state)
    try:
        yield box.start()
    finally:
        box.remove()


def test_first_container_leads_on_its_socket_and_answers_probes_on_tcp(first: Container) -> None:
    code, status = curl(first.socket, "/leader")
    assert code == 200 and status["node_id"] == first.name, (code, status, first.logs())
    assert first.probe("/health") == 200
    assert first.probe("/ready") == 200
    assert first.probe("/leader") == 200


def test_container_runs_as_the_image_user_on_a_read_only_root(first: Container) -> None:
    assert first.inspect("{{.Config.User}}") == "10001:10001"
    assert first.inspect("{{.HostConfig.ReadonlyRootfs}}") == "true"
    assert podman("exec", first.name, "id", "-u").strip() == "10001"
    done = run([require("podman"), *PODMAN_OPTIONS, "exec", first.name, "touch", "/probe"],
               check=False)  # fmt: skip
    assert done.returncode != 0 and "Read-only file system" in done.stderr, done.stderr


def test_two_containers_on_one_volume_elect_one_leader(first: Container, second: Container) -> None:
    answers = {box.name: curl(box.socket, "/leader") for box in (first, second)}
    codes = sorted(code for code, _ in answers.values())
    assert codes == [200, 503], answers
    follower = answers[second.name][1]
    assert follower["role"] == "follower" and follower["leader"]["node_id"] == first.name
    assert lease_row(first.state)[0] is not None


def test_podman_stop_hands_over_then_releases_the_lease(
    first: Container, second: Container
) -> None:
    _, term = lease_row(first.state)
    started = time.monotonic()
    podman("stop", first.name, timeout=60)
    assert first.inspect("{{.State.ExitCode}}") == "0", first.logs()
    assert "released election default" in first.logs()
    # The release wakes the standby at once: far sooner than the 15 s ttl would.
    wait_for(lambda: curl(second.socket, "/leader")[0] == 200, timeout=10, what="takeover")
    print(f"\npodman stop of the leader to the other container leading: "
          f"{time.monotonic() - started:.2f}s")  # fmt: skip
    assert lease_row(first.state) == (second.name, term + 1)
    podman("stop", second.name, timeout=60)
    assert second.inspect("{{.State.ExitCode}}") == "0", second.logs()
    # Expired in place: no holder, and the term survives for the next leader.
    assert lease_row(second.state) == (None, term + 1)


def test_image_metadata_matches_the_dockerfile(image: str) -> None:
    config = json.loads(podman("image", "inspect", "--format", "{{json .Config}}", image))
    assert config["Entrypoint"] == ["leaderd"] and config["Cmd"] == ["run"]
    assert config["StopSignal"] == "SIGTERM"
    assert set(config["Volumes"]) == {"/run/leaderd", "/var/lib/leaderd"}
