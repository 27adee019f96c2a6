"""`run -- COMMAND` as `consul lock` users expect (docs/run.md, "Exit codes"): `--try`
gives up with its own code, and `--exit-status fixed` keeps a child's status from reading
as leaderd's own."""

from __future__ import annotations

import os

import pytest

from tests.support.daemons import Daemon, wait_for

pytestmark = pytest.mark.slow


def job(workdir: str, name: str, script: str, *flags: str) -> Daemon:
    return Daemon(name, f"sqlite://{workdir}/lease.db", workdir=workdir,
                  extra_args=list(flags), command=["sh", "-c", script])  # fmt: skip


def test_try_gives_up_with_75_when_another_node_leads(workdir: str) -> None:
    holder = Daemon("holder", f"sqlite://{workdir}/lease.db", workdir=workdir).start()
    wait_for(holder.is_leader, 10, what="the holder to lead")
    marker = os.path.join(workdir, "ran")
    late = job(workdir, "late", f"touch {marker}", "--try", "1s").start()
    assert late.wait(30) == 75, late.log()
    assert "within 1s (--try): giving up" in late.log()
    assert not os.path.exists(marker) and holder.is_leader()
    assert holder.stop() == 0


def test_try_runs_the_command_when_it_leads_in_time(workdir: str) -> None:
    done = job(workdir, "first", "exit 0", "--try", "30").start()
    assert done.wait(30) == 0, done.log()


@pytest.mark.parametrize(
    ("script", "flags", "code"),
    [
        ("exit 2", (), 2),  # passes through: reads as bad configuration
        ("exit 2", ("--exit-status", "fixed"), 3),
        ("exit 1", ("--exit-status", "fixed"), 3),
        ("exit 75", ("--exit-status", "fixed"), 3),
        ("kill -9 $$", ("--exit-status", "fixed"), 3),
        ("kill -9 $$", (), 137),
        ("exit 0", ("--exit-status", "fixed"), 0),
    ],
)
def test_child_status_maps_to_leaderds(
    workdir: str, script: str, flags: tuple[str, ...], code: int
) -> None:
    d = job(workdir, "child", script, *flags).start()
    assert d.wait(30) == code, d.log()
    if flags and code == 3:
        assert "exiting with status 3" in d.log()
