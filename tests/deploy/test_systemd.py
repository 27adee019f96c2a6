"""systemd units and the example configuration, checked with systemd's own tools.

`systemd-analyze verify` needs every ExecStart binary to exist, so each unit is
verified as a copy whose /usr/bin/leaderd points at a stub executable; nothing
else in the copy changes.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from ._tools import ROOT, default_shutdown_timeout, require, run, seconds, unit_settings

pytestmark = pytest.mark.deploy

UNITS = ROOT / "systemd"
SERVICE, SOCKET, TEMPLATE = "leaderd.service", "leaderd.socket", "leaderd@.service"
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictNamespaces": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "SystemCallArchitectures": "native",
    "CapabilityBoundingSet": "",
}


@pytest.fixture(scope="module")
def unit_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Copies of the units whose ExecStart binary is a stub that exists."""
    require("systemd-analyze")
    where = tmp_path_factory.mktemp("units")
    stub = where / "bin" / "leaderd"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    for unit in (SERVICE, SOCKET, TEMPLATE):
        text = (UNITS / unit).read_text().replace("/usr/bin/leaderd", str(stub))
        (where / unit).write_text(text)
    # Documentation=man:leaderd(8): verify runs man, which finds the page the package ships.
    (where / "man" / "man8").mkdir(parents=True)
    (where / "man" / "man8" / "leaderd.8").write_text(
        (ROOT / "packaging" / "leaderd.8").read_text()
    )
    # An instance of the template, so that %i is expanded as systemd would.
    (where / "leaderd@reindex.service").write_text((where / TEMPLATE).read_text())
    return where


def verify(unit_dir: Path, unit: str) -> str:
    env = {**os.environ, "MANPATH": str(unit_dir / "man")}
    done = run(["systemd-analyze", "verify", unit], cwd=unit_dir, check=False, env=env)
    assert done.returncode == 0, done.stderr
    return (done.stdout + done.stderr).strip()


@pytest.mark.parametrize("unit", [SERVICE, SOCKET, TEMPLATE, "leaderd@reindex.service"])
def test_unit_passes_systemd_analyze_verify(unit_dir: Path, unit: str) -> None:
    # verify exits 0 on unknown keys too: any output at all is a finding.
    assert verify(unit_dir, unit) == ""


def test_verify_reports_a_broken_unit(unit_dir: Path) -> None:
    """The check above can fail: a misspelt key is reported."""
    broken = (unit_dir / SERVICE).read_text().replace("Type=notify", "Typ=notify")
    (unit_dir / "broken.service").write_text(broken)
    assert "Unknown key" in verify(unit_dir, "broken.service")


def test_verify_needs_the_binary() -> None:
    """Why the stub exists: the shipped unit names /usr/bin/leaderd, installed by the package."""
    assert "ExecStart=/usr/bin/leaderd run" in (UNITS / SERVICE).read_text()


def test_service_is_a_notify_daemon_with_watchdog_and_directories() -> None:
    service = unit_settings(UNITS / SERVICE)["Service"]
    assert service["Type"] == ["notify"]
    assert service["NotifyAccess"] == ["main"]
    assert seconds(service["WatchdogSec"][0]) > 0
    assert service["Restart"] == ["on-failure"]
    assert service["RestartPreventExitStatus"] == ["2"]  # bad configuration
    assert service["RuntimeDirectory"] == ["leaderd"]
    assert service["StateDirectory"] == ["leaderd"]
    # leaderd.socket's file lives in /run/leaderd: it must survive a service stop.
    assert service["RuntimeDirectoryPreserve"] == ["yes"]
    assert service.get("User") == ["leaderd"] or service.get("DynamicUser") == ["yes"]
    assert "ExecReload" not in service, "leaderd has no reload: ExecReload would lie"
    assert service["KillMode"] == ["mixed"], "leaderd must stop its child before releasing"


def test_stop_timeout_covers_the_daemons_shutdown_timeout() -> None:
    shutdown_timeout = default_shutdown_timeout()
    for unit in (SERVICE, TEMPLATE):
        stop = seconds(unit_settings(UNITS / unit)["Service"]["TimeoutStopSec"][0])
        assert stop >= shutdown_timeout + 2, f"{unit}: TimeoutStopSec {stop}s"


def test_service_is_hardened() -> None:
    service = unit_settings(UNITS / SERVICE)["Service"]
    for key, value in HARDENING.items():
        assert service.get(key) == [value], f"{key}={value} missing"
    families = service["RestrictAddressFamilies"][0].split()
    assert sorted(families) == ["AF_INET", "AF_INET6", "AF_UNIX"]
    assert "@system-service" in service["SystemCallFilter"]


def exposure(unit_dir: Path, unit: str) -> float:
    done = run(["systemd-analyze", "security", "--offline=yes", unit], cwd=unit_dir)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert match, done.stdout
    return float(match.group(1))


@pytest.mark.parametrize("unit", [SERVICE, "leaderd@reindex.service"])
def test_service_exposure_is_low(unit_dir: Path, unit: str) -> None:
    """leaderd@.service scored 7.4 ("MEDIUM") against 1.4 for leaderd.service."""
    assert exposure(unit_dir, unit) <= 2.0


def test_template_is_hardened_like_the_service() -> None:
    template = unit_settings(UNITS / TEMPLATE)["Service"]
    service = unit_settings(UNITS / SERVICE)["Service"]
    for key, value in HARDENING.items():
        if key == "RestrictNamespaces":  # the job's own PID namespace (docs/run.md)
            assert template.get(key) == ["user pid"]
            continue
        assert template.get(key) == [value], f"{key}={value} missing"
    assert template["SystemCallFilter"] == service["SystemCallFilter"]
    # Jobs resolve names: glibc's getaddrinfo(AI_ADDRCONFIG) asks netlink.
    families = template["RestrictAddressFamilies"][0].split()
    assert sorted(families) == ["AF_INET", "AF_INET6", "AF_NETLINK", "AF_UNIX"]


def test_units_document_the_man_page() -> None:
    for unit, section in ((SERVICE, "Unit"), (SOCKET, "Unit"), (TEMPLATE, "Unit")):
        assert unit_settings(UNITS / unit)[section]["Documentation"] == ["man:leaderd(8)"]


def test_man_page_is_generated_from_the_parser_and_reads_cleanly() -> None:
    page = ROOT / "packaging" / "leaderd.8"
    done = run([sys.executable, ROOT / "packaging" / "manpage.py"])
    assert done.stdout == page.read_text(), "run: python packaging/manpage.py > " + str(page)
    from leaderd.startup.options import DAEMON_OPTIONS

    for flags, _ in DAEMON_OPTIONS:
        assert flags[-1].replace("-", "\\-") in done.stdout, flags
    man = run(["man", "--warnings", "-E", "UTF-8", "-l", page], env={"MANWIDTH": "80"})
    assert man.stderr == "", man.stderr
    assert "EXIT STATUS" in man.stdout and "LEADERD_MAX_CONNECTIONS" in man.stdout


def test_socket_matches_the_service() -> None:
    socket = unit_settings(UNITS / SOCKET)["Socket"]
    service = unit_settings(UNITS / SERVICE)["Service"]
    assert socket["ListenStream"] == ["/run/leaderd/leaderd.sock"]
    assert socket["SocketMode"] == ["0660"]
    assert socket["SocketGroup"] == service["Group"]
    # The daemon's default socket under systemd is $RUNTIME_DIRECTORY/leaderd.sock.
    assert socket["ListenStream"][0] == f"/run/{service['RuntimeDirectory'][0]}/leaderd.sock"
    assert unit_settings(UNITS / SOCKET)["Install"]["WantedBy"] == ["sockets.target"]


def test_template_runs_the_job_from_its_environment_file() -> None:
    service = unit_settings(UNITS / TEMPLATE)["Service"]
    assert service["EnvironmentFile"] == ["/etc/leaderd/%i.env"]
    (exec_start,) = service["ExecStart"]
    assert exec_start.startswith("/usr/bin/leaderd run --election %i ")
    assert exec_start.endswith(" -- $JOB_COMMAND")  # unbraced: split into arguments
    assert service["Type"] == ["notify"]
    assert service["KillMode"] == ["mixed"]
    # One socket per instance, so instances never unlink each other's.
    assert service["RuntimeDirectory"] == ["leaderd/%i"]
    assert "--socket %t/leaderd/%i/leaderd.sock" in exec_start


def test_sysusers_creates_the_leaderd_user(tmp_path: Path) -> None:
    require("systemd-sysusers")
    (tmp_path / "etc").mkdir()
    run(["systemd-sysusers", f"--root={tmp_path}", UNITS / "leaderd.sysusers"])
    passwd = (tmp_path / "etc" / "passwd").read_text()
    group = (tmp_path / "etc" / "group").read_text()
    assert re.search(r"^leaderd:x:\d+:\d+:.*:/var/lib/leaderd:", passwd, re.M), passwd
    assert re.search(r"^leaderd:x:\d+:", group, re.M), group


# --- the example /etc/leaderd/leaderd.toml ----------------------------------

EXAMPLE = ROOT / "packaging" / "leaderd.toml"


def uncommented(text: str) -> str:
    """The example with every commented setting and table switched on."""
    return re.sub(r"^#(\[|[a-z_]+ = )", r"\1", text, flags=re.M)


def test_example_config_as_shipped_means_all_defaults() -> None:
    import tomllib

    assert tomllib.loads(EXAMPLE.read_text()) == {}


def test_example_config_documents_every_setting() -> None:
    import dataclasses
    import tomllib

    from leaderd.election.timing import Timing
    from leaderd.startup.config import Config

    data = tomllib.loads(uncommented(EXAMPLE.read_text()))
    # Composed from other settings: the elections' tables, the file itself, on_* and hook_timeout.
    internal = {"elections", "config_file", "state_dir", "hooks"}
    top = {f.name for f in dataclasses.fields(Config)} - internal
    assert top <= set(data), f"undocumented settings: {sorted(top - set(data))}"
    timing = {f.name for f in dataclasses.fields(Timing)}
    assert timing <= set(data["defaults"]), sorted(timing - set(data["defaults"]))
    assert data["elections"], "no [elections.NAME] example"


def test_example_config_uncommented_passes_check_config(tmp_path: Path) -> None:
    config = tmp_path / "leaderd.toml"
    config.write_text(uncommented(EXAMPLE.read_text()))
    done = run(
        [sys.executable, "-m", "leaderd", "check-config", "-c", config],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert "config ok" in done.stdout


def test_deployment_docs_give_each_units_score(unit_dir: Path) -> None:
    """The template's was given as 1.5 while systemd-analyze said 1.8."""
    text = " ".join((ROOT / "docs" / "deployment.md").read_text().split())
    claims = {
        SERVICE: r"`systemd-analyze security leaderd` rates the unit about ([0-9.]+)",
        "leaderd@reindex.service": (
            r"`systemd-analyze security leaderd@NAME` rates it about ([0-9.]+)"
        ),
    }
    for unit, claim in claims.items():
        found = re.search(claim, text)
        assert found, claim
        assert float(found.group(1)) == exposure(unit_dir, unit), unit


def test_example_config_states_the_kill_grace_rule_of_the_code() -> None:
    """It said `ttl - renew_interval` and left out clock_drift and safety_margin."""
    from leaderd.election.timing import Timing

    text = " ".join(EXAMPLE.read_text().replace("#", " ").split())
    assert "ttl * (1 - clock_drift) - safety_margin - renew_interval" in text
    room = Timing().lease_window - Timing().renew_interval
    assert f"({room:g} with the default timing)" in text
    assert "SQLite has no schema" in text
