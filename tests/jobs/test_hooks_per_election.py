"""Transition hooks per election (docs/run.md, "Transition hooks"), with a real daemon: each
election runs its own `[elections.NAME]` hooks, or the file's top-level ones, and names
itself in LEADERD_ELECTION; a bad per-election hook setting stops the start with exit 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.daemons import REPO, Daemon, short_tempdir, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir("ld-hp-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def hook(workdir: str, tag: str) -> str:
    """A command line appending "<tag> <LEADERD_ELECTION> <LEADERD_ROLE>" to a shared file."""
    out = os.path.join(workdir, "hooks")
    return f'sh -c \'echo {tag} \\"$LEADERD_ELECTION\\" \\"$LEADERD_ROLE\\" >> {out}\''


def runs(workdir: str) -> list[tuple[str, ...]]:
    try:
        with open(os.path.join(workdir, "hooks")) as f:
            return sorted(tuple(line.split()) for line in f)
    except FileNotFoundError:
        return []


def test_each_election_runs_its_own_hooks(workdir: str) -> None:
    config = os.path.join(workdir, "leaderd.toml")
    with open(config, "w") as f:
        f.write(f"""
on_elected = "{hook(workdir, "all-up")}"
on_demoted = "{hook(workdir, "all-down")}"

[elections.db]
on_elected = "{hook(workdir, "db-up")}"

[elections.cron]
on_elected = "{hook(workdir, "cron-up")}"
on_demoted = "{hook(workdir, "cron-down")}"

[elections.plain]
""")
    d = Daemon("node-a", f"sqlite://{workdir}/lease.db", workdir=workdir,
               elections=(), extra_args=("--config", config)).start()  # fmt: skip
    d.wait_ready()
    wait_for(lambda: len(runs(workdir)) >= 3, timeout=10, what="three elected hooks")
    assert d.stop() == 0
    assert runs(workdir) == sorted([
        ("db-up", "db", "leader"), ("cron-up", "cron", "leader"), ("all-up", "plain", "leader"),
        ("all-down", "db", "stopped"), ("cron-down", "cron", "stopped"),
        ("all-down", "plain", "stopped"),
    ]), d.log()  # fmt: skip


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("on_elected = \"vip 'up\"", "election db: on_elected: No closing quotation"),
        ("on_demoted = 'true'\nhook_timeout = 30", "election db: hook_timeout (30s) must be less"),
    ],
)  # fmt: skip
def test_a_bad_hook_setting_of_one_election_exits_2_with_one_line(
    workdir: str, table: str, message: str
) -> None:
    config = os.path.join(workdir, "leaderd.toml")
    with open(config, "w") as f:
        f.write(f"[elections.other]\n[elections.db]\n{table}\n")
    done = subprocess.run(
        [sys.executable, "-m", "leaderd", "run", "--config", config,
         "--backend", f"sqlite://{workdir}/l.db", "--socket", f"{workdir}/x.sock"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=30,
        check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
