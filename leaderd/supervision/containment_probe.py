"""Which containment this host allows for `run -- COMMAND`, decided once at startup and said
in the log (docs/run.md, "Containment"): the keeper itself is asked, in a trial run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from dataclasses import dataclass

from ..events import Event, extra
from .containment import PR_SET_CHILD_SUBREAPER, prctl, why_not
from .keeper_protocol import CONTAINED, SKIPPED, Lines

log = logging.getLogger("leaderd.supervisor")

START_TIMEOUT = 30.0  # the keeper is a fresh interpreter: slow on a loaded host
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BOOT = (
    f"import sys; sys.path[:0] = [{_ROOT!r}]; from leaderd.supervision.keeper import main; main()"
)


def keeper_argv(*args: str) -> list[str]:
    """The keeper's command line: the standard library and keeper.py, nothing else."""
    return [sys.executable, "-I", "-S", "-c", _BOOT, *args]


@dataclass(frozen=True)
class Plan:
    mode: str  # what the probe found: pidns, cgroup or session
    contain: tuple[str, ...]  # the keeper's --contain specs, best first
    cgroup: str = ""  # the command's cgroup, which leaderd created, if it is in the plan


async def plan() -> Plan:
    """Become a subreaper, find the best containment this host allows, and say it in the log."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    cgroup, no_cgroup = command_cgroup()
    specs = ("pidns", *([f"cgroup={cgroup}"] if cgroup else []), "session")
    mode, skipped = await asyncio.to_thread(_probe, specs)
    if no_cgroup:
        skipped.append(("cgroup", no_cgroup))
    _log_plan(mode, cgroup, skipped)
    return Plan(mode, specs, cgroup)


def _probe(specs: tuple[str, ...]) -> tuple[str, list[tuple[str, str]]]:
    argv = keeper_argv("--report", "1", "--probe", *[f"--contain={spec}" for spec in specs])
    try:
        out = subprocess.run(argv, capture_output=True, timeout=START_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return "session", [("pidns", f"the keeper's probe failed: {why_not(exc)}")]
    mode, skipped = "", []
    for word, rest in Lines().feed(out.stdout):
        first, _, second = rest.partition(" ")
        if word == SKIPPED:
            skipped.append((first, second))
        elif word == CONTAINED:
            mode = first
    if not mode:  # the trial run failed: say how (each keeper still tries the best first)
        said = out.stderr.decode(errors="replace").strip().splitlines()
        why = said[-1] if said else f"exit status {out.returncode}"
        return "session", [*skipped, ("pidns", f"the keeper's probe failed: {why}")]
    return mode, skipped


def _log_plan(mode: str, cgroup: str, skipped: list[tuple[str, str]]) -> None:
    why = "; ".join(f"{m}: {reason}" for m, reason in skipped)
    fields = extra(Event.CONTAINMENT, mode=mode)
    if mode == "pidns":
        log.info(
            "containment: COMMAND runs in a PID namespace of its own; nothing it starts can "
            "outlive its keeper",
            extra=fields,
        )
    else:
        log.warning(
            "containment: COMMAND runs in %s (%s); leaderd, its keeper or its guard ends all "
            "of it, but if leaderd and the keeper die at once, only the service manager "
            "(systemd) or a container's PID 1 can end what it started",
            f"cgroup {cgroup}" if mode == "cgroup" else "a process group with a subreaper",
            why,
            extra=fields,
        )


def command_cgroup() -> tuple[str, str]:
    """A cgroup for the command below leaderd's own, if that one was delegated to leaderd
    (systemd Delegate=yes); else "" and why not."""
    own = _own_cgroup()
    if not own:
        return "", "no cgroup v2 hierarchy here"
    if not os.access(f"{own}/cgroup.procs", os.W_OK):
        return "", f"{own} is read-only to leaderd (not delegated, or ProtectControlGroups)"
    if not _delegated(own):
        return "", f"{own} was not delegated to leaderd (systemd Delegate=yes)"
    path = f"{own}/leaderd-command.{os.getpid()}"
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return "", f"cannot create {path}: {why_not(exc)}"
    return path, ""


def _own_cgroup() -> str:
    """The directory of this process's cgroup v2 group, "" if there is none."""
    with open("/proc/self/cgroup") as f:
        group = next((line[3:].strip() for line in f if line.startswith("0::")), "")
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            root, mountpoint = fields[3], fields[4]
            if fstype == "cgroup2" and group.startswith(root) and group:
                return mountpoint + "/" + group[len(root) :].strip("/")
    return ""


def _delegated(path: str) -> bool:
    """systemd marks a delegated group (trusted.delegate, user.delegate) and, for a User=
    service, chowns it; a group root owns without a mark was not handed to us."""
    for name in ("trusted.delegate", "user.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(path, name) == b"1":
                return True
    return os.stat(path).st_uid == os.geteuid() != 0
