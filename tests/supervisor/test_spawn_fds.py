"""Starting a child with the open-file limit reached fails cleanly: no descriptor leaks,
so `run --on-exit restart` can try again once files are free (issue 16)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.daemons import REPO

# In a process of its own: the limit is lowered to leave room for one pipe, not two.
PROBE = """
import asyncio, os, resource, sys
from leaderd.supervision.child import Child

def open_fds():
    return sorted(int(fd) for fd in os.listdir("/proc/self/fd"))

async def main():
    before = open_fds()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(before) + 3, hard))
    for _ in range(3):
        try:
            Child.spawn(["true"], dict(os.environ), 1, 1e9, 1.0, ())
        except OSError as exc:
            failed = exc.errno
        else:
            sys.exit("spawned although no file was left")
    after = [fd for fd in open_fds() if fd <= max(before) + 3]
    print(failed, before == after, ",".join(map(str, before)), ",".join(map(str, after)))

asyncio.run(main())
"""


def test_a_spawn_that_runs_out_of_files_closes_what_it_opened() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert probe.returncode == 0, probe.stderr
    errno, same, before, after = probe.stdout.split(" ", 3)
    assert errno == "24"  # EMFILE
    assert same == "True", f"descriptors left open: before {before}, after {after}"
