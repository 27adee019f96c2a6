"""Packages: the wheel and sdist (python -m build, twine check) and the Debian
package (dpkg-buildpackage through packaging/build-deb.sh, dpkg -c, apt-get -s)."""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from ._tools import INSTALL_HINT, ROOT, project_version, require, require_module, run

# Building the sdist, wheel and .deb (up to 600 + 900 s of their own timeouts).
pytestmark = [pytest.mark.deploy, pytest.mark.timeout(1800)]

DEBIAN_PYTHON = Path("/usr/bin/python3")
DEBIAN_MODULES = ("aiohttp", "aiosqlite", "asyncpg", "jsonschema", "prometheus_client", "uvloop")


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_module("build")
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", out, ROOT], timeout=600)
    return out


def test_build_makes_one_wheel_and_one_sdist(dists: Path) -> None:
    version = project_version()
    assert sorted(p.name for p in dists.iterdir()) == [
        f"leaderd-{version}-py3-none-any.whl",
        f"leaderd-{version}.tar.gz",
    ]


def test_twine_check_passes(dists: Path) -> None:
    twine = require("twine")
    done = run([twine, "check", "--strict", *sorted(dists.iterdir())])
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_wheel_carries_the_package_data_and_the_console_script(dists: Path) -> None:
    (wheel,) = dists.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        scripts = zf.read(entry_points).decode()
    for name in ("leaderd/py.typed", "leaderd/openapi.json", "leaderd/config.schema.json"):
        assert name in names
    assert not any(n.startswith(("tests/", "bench/", "examples/")) for n in names)
    assert re.search(r"^leaderd = leaderd\.startup\.cli:main$", scripts, re.M), scripts


# --- the Debian package -------------------------------------------------------


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for tool in ("dpkg-buildpackage", "dh", "dh_python3", "dpkg-deb"):
        require(tool)
    if not Path("/usr/share/dh-python/dhpython/build/plugin_pyproject.py").exists():
        pytest.fail("pybuild-plugin-pyproject is missing: run .ci/install-deploy-tools.sh")
    out = tmp_path_factory.mktemp("deb")
    run([ROOT / "packaging" / "build-deb.sh", out], timeout=900)
    (package,) = out.glob("leaderd_*_all.deb")
    return package


def test_deb_version_is_the_project_version(deb: Path) -> None:
    assert deb.name == f"leaderd_{project_version()}_all.deb"
    changelog = (ROOT / "packaging" / "debian" / "changelog").read_text()
    assert changelog.startswith(f"leaderd ({project_version()})")


def test_deb_contents(deb: Path) -> None:
    listing = run(["dpkg", "-c", deb]).stdout
    files = {line.split()[-1].removeprefix(".") for line in listing.splitlines()}
    expected = {
        "/usr/bin/leaderd",
        "/usr/lib/python3/dist-packages/leaderd/__init__.py",
        "/usr/lib/python3/dist-packages/leaderd/startup/cli.py",
        "/usr/lib/python3/dist-packages/leaderd/openapi.json",
        "/usr/lib/python3/dist-packages/leaderd/config.schema.json",
        f"/usr/lib/python3/dist-packages/leaderd-{project_version()}.dist-info/METADATA",
        "/lib/systemd/system/leaderd.service",
        "/lib/systemd/system/leaderd.socket",
        "/lib/systemd/system/leaderd@.service",
        "/usr/share/man/man8/leaderd.8.gz",
        "/usr/lib/sysusers.d/leaderd.conf",
        "/etc/leaderd/leaderd.toml",
        "/usr/share/doc/leaderd/copyright",
        "/usr/share/leaderd/prometheus/leaderd.rules.yml",
        "/usr/share/bash-completion/completions/leaderd",
        "/usr/share/zsh/vendor-completions/_leaderd",
    }
    assert expected <= files, sorted(expected - files)
    assert not any("/tests/" in f or "__pycache__" in f for f in files)
    # The shipped files are the ones in the tree, byte for byte.
    for shipped, source in [
        ("./lib/systemd/system/leaderd.service", "systemd/leaderd.service"),
        ("./etc/leaderd/leaderd.toml", "packaging/leaderd.toml"),
        (
            "./usr/share/leaderd/prometheus/leaderd.rules.yml",
            "packaging/prometheus/leaderd.rules.yml",
        ),
    ]:
        inside = subprocess.run(
            ["dpkg-deb", "--fsys-tarfile", deb], capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(inside)) as tar:
            member = tar.extractfile(shipped)
            assert member is not None
            assert member.read() == (ROOT / source).read_bytes(), shipped


def test_deb_metadata_and_maintainer_scripts(deb: Path, tmp_path: Path) -> None:
    info = run(["dpkg-deb", "--field", deb, "Depends"]).stdout
    for package in (
        "python3-aiohttp",
        "python3-aiosqlite",
        "python3-asyncpg",
        "python3-jsonschema",
        "python3-prometheus-client",
        "python3-uvloop",
        "python3-systemd",  # native journal entries
    ):
        assert package in info, info
    assert "python3:any (>= 3.11" in info, info
    run(["dpkg-deb", "--control", deb, tmp_path])
    assert (tmp_path / "conffiles").read_text().split() == ["/etc/leaderd/leaderd.toml"]
    postinst = (tmp_path / "postinst").read_text()
    # The user exists before the service is first started.
    assert postinst.index("systemd-sysusers") < postinst.index("deb-systemd-invoke")
    assert "deb-systemd-helper enable 'leaderd.service'" in postinst
    # The socket is shipped for the operator to enable; nothing starts it on install.
    assert "leaderd.socket" in postinst and "invoke $_dh_action 'leaderd.socket'" not in postinst


def test_deb_dependencies_resolve_with_apt(deb: Path) -> None:
    apt = require("apt-get")
    done = run([apt, "install", "--simulate", "--no-install-recommends", deb], timeout=300)
    assert re.search(r"^Inst leaderd ", done.stdout, re.M), done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_deb_daemon_runs_on_debian_python(deb: Path, tmp_path: Path) -> None:
    """The packaged daemon, on Debian's python3 and Debian's libraries, answers /leader."""
    if not DEBIAN_PYTHON.exists():
        pytest.fail("/usr/bin/python3 (Debian's) is missing")
    missing = run(
        [DEBIAN_PYTHON, "-c", f"import {', '.join(DEBIAN_MODULES)}"],
        check=False,
    )
    if missing.returncode != 0:
        pytest.fail(f"Debian's runtime dependencies are missing: {INSTALL_HINT}\n{missing.stderr}")
    root = tmp_path / "root"
    run(["dpkg-deb", "--extract", deb, root])
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(root / "usr/lib/python3/dist-packages"),
        "LEADERD_CONFIG": os.devnull,
        "HOME": str(tmp_path),
    }
    leaderd = [DEBIAN_PYTHON, "-s", root / "usr/bin/leaderd"]
    assert run([*leaderd, "--version"], env=env).stdout.strip() == f"leaderd {project_version()}"
    port = _free_port()
    daemon = subprocess.Popen(
        [*leaderd, "run", "--backend", f"sqlite://{tmp_path}/leaderd.db",
         "--socket", tmp_path / "leaderd.sock", "--listen", f"127.0.0.1:{port}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        import urllib.request

        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/leader", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert daemon.poll() is None, daemon.communicate()[0]
                assert time.monotonic() < deadline, "no answer on /leader within 15s"
                time.sleep(0.2)
        abandon_watchers(str(tmp_path / "leaderd.sock"))
    finally:
        daemon.terminate()
        output = daemon.communicate(timeout=20)[0]
    assert daemon.returncode == 0, output
    assert "Traceback" not in output, output


def unix_get(path: str, target: str) -> bytes:
    """A request from a client that half-closes its socket, as `printf | socat -` does."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(f"GET {target} HTTP/1.0\r\n\r\n".encode())
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def watchers(path: str) -> float:
    answer = unix_get(path, "/metrics")
    assert answer.split(b" ")[1] == b"200", answer[:200]
    found = re.findall(rb"^leaderd_watchers\{[^}]*\} ([0-9.e+]+)$", answer, re.M)
    return sum(float(n) for n in found)


def abandon_watchers(path: str) -> None:
    """On Debian 12's aiohttp 3.8, 40 clients that went away left 40 handlers behind."""
    clients = []
    for i in range(40):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        target = "/watch?stream=1" if i % 2 else "/watch?timeout=120"
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        clients.append(sock)
    deadline = time.monotonic() + 10
    while watchers(path) < 40:
        assert time.monotonic() < deadline, "40 watchers never registered"
        time.sleep(0.1)
    for sock in clients:
        sock.close()
    deadline = time.monotonic() + 5
    while (left := watchers(path)) > 0:
        assert time.monotonic() < deadline, f"{left:g} abandoned watchers still registered"
        time.sleep(0.1)
