"""The shipped units under a real systemd: booted as PID 1 in throwaway namespaces.

boot-systemd.sh (beside this file) builds an overlay root over the host's / with
a tmpfs upper layer, read-only /proc/sys and /sys and no network, and boots
/lib/systemd/systemd in it. The units and the example config are installed
there unchanged; only /usr/bin/leaderd is a small launcher for this checkout,
installed with its dependencies under /opt/leaderd. Needs root (unshare, overlay).

The host's own leaderd state never reaches the machine: the script masks /var/lib/leaderd,
/run/leaderd and /etc/leaderd. To prove it, the lower layer also holds a stand-in for the
host's (plant_host_state): a lease held for this host name, which is the machine's too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaderd.backends import Candidate, backend_from_url
from tests.support.backend_calls import ask

from ._tools import ROOT, require, run, source_copy

# Staging a pip install (its own timeout: 600 s) and booting systemd: the module fixture's
# first test pays for both.
pytestmark = [pytest.mark.deploy, pytest.mark.timeout(900)]

BOOT = Path(__file__).with_name("boot-systemd.sh")
LAUNCHER = """#!/usr/bin/python3 -s
import sys
sys.path.insert(0, "/opt/leaderd/site")
from leaderd.startup.cli import main
sys.exit(main())
"""


class Machine:
    """A booted systemd; commands run inside it through nsenter."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        enter = ["nsenter", "-t", str(self.pid), "-m", "-p", "-r", "-w"]
        # The machine's own environment: ours points leaderd's defaults at a test directory
        # (tests/conftest.py), and the host's PATH may hold a leaderd of a checkout in /tmp,
        # which the machine's private /tmp hides.
        inside = ["env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        return run([*enter, *inside, *cmd], check=check, timeout=60)

    def show(self, unit: str, prop: str) -> str:
        return self.run("systemctl", "show", unit, "-p", prop, "--value").stdout.strip()

    def wait_for(self, what: str, predicate: object, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():  # type: ignore[operator]
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.3)


def stage(where: Path) -> None:
    """What the throwaway root gets on top of the host's files."""
    site = where / "opt" / "leaderd" / "site"
    src = source_copy(where.parent / "src")
    run([sys.executable, "-m", "pip", "install", "-q", "--target", site, src], timeout=600)
    launcher = where / "usr" / "bin" / "leaderd"
    launcher.parent.mkdir(parents=True)
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)
    units = where / "etc" / "systemd" / "system"
    (units / "multi-user.target.wants").mkdir(parents=True)
    for unit in ("leaderd.service", "leaderd.socket", "leaderd@.service"):
        (units / unit).write_text((ROOT / "systemd" / unit).read_text())
    (units / "multi-user.target.wants" / "leaderd.service").symlink_to(
        "/etc/systemd/system/leaderd.service"
    )
    sysusers = where / "usr" / "lib" / "sysusers.d"
    sysusers.mkdir(parents=True)
    (sysusers / "leaderd.conf").write_text((ROOT / "systemd" / "leaderd.sysusers").read_text())
    config = where / "etc" / "leaderd"
    config.mkdir(parents=True)
    (config / "leaderd.toml").write_text((ROOT / "packaging" / "leaderd.toml").read_text())
    (config / "job.env").write_text("JOB_COMMAND=/bin/sleep 1000\n")


# The machine's UTS namespace is a copy of the host's: the same host name, so the same
# default node id.
HOST_NAME = socket.gethostname()
HOST_STATE = ("var/lib/leaderd", "run/leaderd", "etc/leaderd")
PLANTED = "planted-host-state"


def plant_host_state(host: Path) -> None:
    """A stand-in for what a host's `make run` as root leaves behind, in the directories
    the machine must not see: a lease on both of its elections for this host name (another
    instance, an hour's ttl), and a marker file in each."""
    for directory in HOST_STATE:
        (host / directory).mkdir(parents=True)
        (host / directory / PLANTED).write_text("the host's, not the machine's\n")
    asyncio.run(_hold_leases(f"sqlite://{host / 'var/lib/leaderd/leaderd.db'}"))


async def _hold_leases(url: str) -> None:
    backend, elections = backend_from_url(url), ("default", "job")
    holder = Candidate(HOST_NAME)
    await backend.open(elections)
    try:
        for election in elections:
            lease = await ask(backend, election, holder, 3600, timeout=30)
            assert lease.held_by(holder), lease
    finally:
        await backend.close()


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    if os.geteuid() != 0:
        pytest.fail("booting systemd needs root (unshare, overlay mounts)", pytrace=False)
    for tool in ("unshare", "nsenter", "chroot", "timeout", "systemd-sysusers"):
        require(tool)
    if not Path("/lib/systemd/systemd").exists():
        pytest.fail("/lib/systemd/systemd is missing: install systemd", pytrace=False)
    base = tmp_path_factory.mktemp("boot")
    stage(base / "stage")
    plant_host_state(base / "host")
    log = open(base / "boot.log", "w")  # noqa: SIM115 - kept open while systemd runs
    # --kill-child: when unshare dies, systemd (PID 1 inside) and all under it die too;
    # timeout bounds the whole machine's life even if this test process is killed.
    unshare = subprocess.Popen(
        ["timeout", "-s", "KILL", "300", "unshare", "--mount", "--pid", "--net", "--uts",
         "--ipc", "--fork", "--kill-child", BOOT, base, base / "host"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    systemd_pid = None
    try:
        systemd_pid = _systemd_pid(unshare.pid, base)
        machine = Machine(systemd_pid)

        def booted() -> bool:
            state = machine.run("systemctl", "is-system-running", check=False).stdout
            return state.strip() in ("running", "degraded")

        machine.wait_for("systemd to boot", booted, timeout=60)
        yield machine
    finally:
        # SIGKILL to the namespace's PID 1 ends every process in it; unshare and
        # timeout then exit on their own.
        if systemd_pid is not None:
            os.kill(systemd_pid, signal.SIGKILL)
        else:
            for pid in reversed(_descendants(unshare.pid)):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            unshare.kill()
        unshare.wait(timeout=30)
        log.close()


def _descendants(pid: int) -> list[int]:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    result = [int(c) for c in children]
    for child in list(result):
        result += _descendants(child)
    return result


def _systemd_pid(timeout_pid: int, base: Path) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for pid in _descendants(timeout_pid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                    return pid
            except OSError:
                continue
        time.sleep(0.2)
    pytest.fail(f"systemd did not start:\n{(base / 'boot.log').read_text()}")


def test_host_leaderd_state_stays_outside(machine: Machine) -> None:
    """Under the host's directories lies a lease for this host name: the machine sees none
    of them, and its daemon leads at once instead of waiting out an hour's lease."""
    for directory in HOST_STATE:
        listing = machine.run("ls", "-A", f"/{directory}", check=False).stdout
        assert PLANTED not in listing, f"/{directory}: {listing}"
    machine.wait_for("leaderd active", lambda: machine.show("leaderd", "ActiveState") == "active")
    # READY=1 came after the first round: a planted lease would make it a follower.
    done = machine.run("leaderd", "status", "--json", check=False)
    default = json.loads(done.stdout)["elections"]["default"]
    assert default["is_leader"] and default["leader"]["node_id"] == HOST_NAME, default
    assert done.returncode == 0, done.stderr


def test_service_reports_its_status_line(machine: Machine) -> None:
    machine.wait_for("leaderd active", lambda: machine.show("leaderd", "ActiveState") == "active")
    status = machine.run("systemctl", "status", "leaderd", "--no-pager", check=False).stdout
    assert re.search(r'Status: "default: leader \(leader \S+, term \d+\)"', status), status
    assert machine.show("leaderd", "User") == "leaderd"
    assert machine.run("leaderd", "status", "-q", check=False).returncode == 0


def test_service_runs_hardened_with_watchdog(machine: Machine) -> None:
    pid = machine.show("leaderd", "MainPID")
    proc = machine.run("cat", f"/proc/{pid}/status").stdout
    assert re.search(r"^NoNewPrivs:\s+1$", proc, re.M), proc
    assert re.search(r"^Seccomp:\s+2$", proc, re.M), proc
    assert re.search(r"^CapEff:\s+0+$", proc, re.M), proc
    machine.wait_for("a watchdog ping", lambda: machine.show("leaderd", "WatchdogTimestamp"))
    listing = machine.run("ls", "-l", "/run/leaderd/leaderd.sock").stdout
    assert listing.startswith("srw-rw----") and " leaderd leaderd " in listing, listing


def test_template_runs_the_job_only_while_leading(machine: Machine) -> None:
    machine.run("systemctl", "start", "leaderd@job")
    status = machine.run("systemctl", "status", "leaderd@job", "--no-pager", check=False).stdout
    assert re.search(r'Status: "job: leader', status), status
    assert "/bin/sleep 1000" in status, status  # the job, in the unit's cgroup
    machine.run("systemctl", "stop", "leaderd@job")
    assert machine.show("leaderd@job", "Result") == "success"
    assert "sleep 1000" not in machine.run("ps", "-eo", "args").stdout


def journal(machine: Machine, *match: str) -> list[dict[str, str]]:
    """The machine's journal entries that match, as journalctl -o json gives them."""
    out = machine.run("journalctl", "--no-pager", "-o", "json", *match).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_decisions_are_journal_entries_with_their_fields(machine: Machine) -> None:
    """python3-systemd is installed: leaderd writes native entries, LEADERD_* fields."""
    machine.run("systemctl", "start", "leaderd@job")
    machine.wait_for("the job's first decision", lambda: journal(machine, "LEADERD_ELECTION=job"))
    machine.run("systemctl", "stop", "leaderd@job")
    by_election = {name: journal(machine, "-u", unit, f"LEADERD_ELECTION={name}")
                   for name, unit in (("default", "leaderd"), ("job", "leaderd@job"))}  # fmt: skip
    for name, entries in by_election.items():
        assert entries and all(e["LEADERD_ELECTION"] == name for e in entries), entries
        assert all(e["_TRANSPORT"] == "journal" and e["SYSLOG_IDENTIFIER"] == "leaderd"
                   for e in entries), entries  # fmt: skip
    acquired = [e for e in by_election["job"] if e.get("LEADERD_EVENT") == "leader"]
    assert acquired, by_election["job"]
    entry = acquired[-1]
    assert entry["MESSAGE"] == f"acquired election job, term {entry['LEADERD_TERM']}"
    assert entry["LEADERD_HOLDER"] == machine.run("hostname").stdout.strip()
    assert entry["PRIORITY"] == "6"
    released = journal(machine, "-u", "leaderd@job", "LEADERD_EVENT=released")
    assert released and released[-1]["LEADERD_TERM"] == entry["LEADERD_TERM"], released
    # Nothing is written twice: no entry came through the stderr stream.
    assert not journal(machine, "-u", "leaderd@job", "_TRANSPORT=stdout")


def test_proc_subset_pid_would_hide_the_sqlite_boot_id(machine: Machine) -> None:
    """Why the unit leaves ProcSubset=pid out (its comment says so): it hides /proc/sys."""
    done = machine.run(
        "systemd-run", "--wait", "--pipe", "--quiet", "-p", "ProcSubset=pid",
        "-p", "ProtectProc=invisible", "/usr/bin/leaderd", "run",
        "--backend", "sqlite:///tmp/procsubset.db", "--socket", "/tmp/procsubset.sock",
        check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "/proc/sys/kernel/random/boot_id" in done.stderr, done.stderr


def test_template_contains_the_job_in_a_pid_namespace(machine: Machine) -> None:
    """Under the unit's hardening (User=leaderd, NoNewPrivileges, RestrictNamespaces=user
    pid) the job runs in a PID namespace of its own, made through a user namespace."""
    machine.run("systemctl", "start", "leaderd@job")
    try:
        machine.wait_for("the job", lambda: machine.run("pgrep", "-x", "sleep", check=False).stdout)
        (job,) = machine.run("pgrep", "-x", "sleep").stdout.split()
        daemon = machine.show("leaderd@job", "MainPID")
        journal = machine.run("journalctl", "-u", "leaderd@job", "--no-pager", "-o", "cat").stdout
        assert "COMMAND runs in a PID namespace of its own" in journal, journal
        namespaces = [
            machine.run("readlink", f"/proc/{pid}/ns/pid").stdout for pid in (job, daemon)
        ]
        assert namespaces[0] != namespaces[1], namespaces
    finally:
        machine.run("systemctl", "stop", "leaderd@job")
    assert not machine.run("pgrep", "-x", "sleep", check=False).stdout


def test_stop_releases_and_socket_activation_restarts(machine: Machine) -> None:
    machine.run("systemctl", "stop", "leaderd")
    assert machine.show("leaderd", "Result") == "success"
    journal = machine.run("journalctl", "-u", "leaderd", "--no-pager", "-o", "cat").stdout
    assert "released election default" in journal, journal
    machine.run("systemctl", "start", "leaderd.socket")
    assert machine.show("leaderd", "ActiveState") == "inactive"
    # The first question starts the daemon, which takes the socket from systemd.
    done = machine.run("leaderd", "status", check=False)
    assert done.returncode in (0, 1, 4), done.stdout + done.stderr  # 4: before its first round
    machine.wait_for("READY=1", lambda: machine.show("leaderd", "ActiveState") == "active")
    assert machine.show("leaderd", "TriggeredBy") == "leaderd.socket"


def test_a_configuration_error_is_not_restarted(machine: Machine) -> None:
    """A SQLite file leaderd cannot create exited 1 after start, so Restart=on-failure
    restarted it every 2 s; caught before start, it exits 2 and RestartPreventExitStatus=2
    holds."""
    dropin = "/etc/systemd/system/leaderd.service.d/broken.conf"
    machine.run("systemctl", "stop", "leaderd.socket", "leaderd")
    machine.run("mkdir", "-p", os.path.dirname(dropin))
    machine.run("sh", "-c", f"printf '[Service]\\nEnvironment=LEADERD_BACKEND=%s\\n' "
                f"sqlite:///proc/x.db > {dropin}")  # fmt: skip
    machine.run("systemctl", "daemon-reload")
    try:
        machine.run("systemctl", "start", "leaderd", check=False)
        machine.wait_for(
            "leaderd failed", lambda: machine.show("leaderd", "ActiveState") == "failed"
        )
        assert machine.show("leaderd", "ExecMainStatus") == "2"
        assert machine.show("leaderd", "NRestarts") == "0"
        journal = machine.run("journalctl", "-u", "leaderd", "--no-pager", "-o", "cat").stdout
        assert "leaderd: SQLite file /proc/x.db: cannot create files in /proc" in journal, journal
    finally:
        machine.run("rm", dropin)
        machine.run("systemctl", "daemon-reload")
        machine.run("systemctl", "reset-failed", "leaderd")
