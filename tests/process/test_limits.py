"""The open-file limit: lifted for watchers, given back to the supervised command."""

from __future__ import annotations

import resource
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import Daemon, short_tempdir, wait_for


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def soft_nofile(limits: str) -> int:
    for line in limits.splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-file limit")


def test_daemon_lifts_its_limit_and_the_child_gets_the_original(workdir: str) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    low = min(1024, hard // 2)
    assert low < hard, "the test needs a hard limit above its soft one"
    # The child reads its own limits: its pid may be one of a PID namespace, not the host's.
    out = Path(workdir, "child.limits")
    d = Daemon(
        "lim",
        f"sqlite://{workdir}/lease.db",
        workdir=workdir,
        command=["sh", "-c", f"cat /proc/self/limits > {out}.new; mv {out}.new {out}; sleep 60"],
    )
    d.args = ["prlimit", f"--nofile={low}:{hard}", *d.args]
    d.start().wait_ready()
    child = wait_for(lambda: out.exists() and out.read_text(), 10)
    assert soft_nofile(Path(f"/proc/{d.pid}/limits").read_text()) == hard
    assert soft_nofile(child) == low
    assert d.stop() == 0
