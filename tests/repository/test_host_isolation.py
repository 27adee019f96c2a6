"""No test reaches this host's own leaderd: a leaderd a test starts with no flags resolves
none of its configuration file, socket, state directory or node id (tests/conftest.py)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

from tests.support.daemons import REPO


def test_a_leaderd_without_flags_resolves_none_of_this_hosts_state() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "leaderd", "check-config"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # The host's directories, not a test's own directory of the same last name.
    assert not re.search(r"(^|[\s:])/(etc|run|var/lib)/leaderd/", done.stdout, re.M), done.stdout
    assert f"node {socket.gethostname()}," not in done.stdout, done.stdout
