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


def soft_nofile(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-file limit")


def test_daemon_lifts_its_limit_and_the_child_gets_the_original(workdir: str) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    low = min(1024, hard // 2)
    assert low < hard, "the test needs a hard limit above its soft one"
    pidfile = f"{workdir}/child.pid"
    d = Daemon(
        "lim",
        f"sqlite://{workdir}/lease.db",
        workdir=workdir,
        command=["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"],
    )
    d.args = ["prlimit", f"--nofile={low}:{hard}", *d.args]
    d.start().wait_ready()
    child = int(wait_for(lambda: Path(pidfile).exists() and Path(pidfile).read_text(), 10))
    assert soft_nofile(d.pid) == hard
    assert soft_nofile(child) == low
    assert d.stop() == 0
