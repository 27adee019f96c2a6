"""Issue 10 regressions on real daemons and a real SQLite file: each path to two leaders,
a reused term or a restarted term, broken the way an operator would break it."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemons import REPO, Daemon, leaders, metric, short_tempdir, wait_for

TTL, RETRY = 2.0, 0.25
FAKE_BOOT_ID = "00000000-1111-2222-3333-444444444444"


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir()
    yield path
    subprocess.run(["rm", "-rf", path], check=False)


def watch_leaders(daemons: list[Daemon], seconds: float) -> list[list[str]]:
    """Ask every daemon /leader over and over; each sample lists who answered 200."""
    samples, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append([d.node_id for d in daemons if d.alive() and d.is_leader()])
    return samples


def term_of(daemon: Daemon) -> int:
    code, body = daemon.get("/leader")
    assert code in (200, 503), code
    return int(body["term"])


def role_of(daemon: Daemon) -> str:
    role: str = daemon.get("/leader")[1]["role"]
    return role


def twin(name: str, db: str, workdir: str, node_id: str = "same-node") -> Daemon:
    """A daemon whose node id is ``node_id`` (its socket and log are named ``name``)."""
    return Daemon(name, db, workdir=workdir, extra_args=["--node-id", node_id])


def test_two_daemons_with_one_node_id_never_both_lead(workdir: str) -> None:
    db = f"sqlite://{workdir}/lease.db"
    one, two = twin("one", db, workdir).start(), twin("two", db, workdir).start()
    one.wait_ready()
    two.wait_ready()
    wait_for(lambda: leaders([one, two]), TTL + 2, what="a leader")
    samples = watch_leaders([one, two], 3.0)
    assert all(len(s) <= 1 for s in samples), [s for s in samples if len(s) > 1][:3]
    other = two if one.is_leader() else one
    assert "held by another process" in other.log() and "same-node" in other.log()
    assert metric(other, "leaderd_duplicate_node_id_total") >= 1


def test_a_restarted_daemon_is_a_new_holder_with_a_new_term(workdir: str) -> None:
    db = f"sqlite://{workdir}/lease.db"
    first = twin("first", db, workdir).start()
    first.wait_ready()
    wait_for(lambda: first.is_leader(), TTL + 2, what="the first daemon to lead")
    term = term_of(first)
    first.kill()  # no release: its lease is still live, but its holder lock is freed
    again = twin("again", db, workdir).start()
    again.wait_ready()
    # Never its predecessor's lease: a new term (at once, the predecessor proven dead).
    wait_for(lambda: again.is_leader(), 2 * TTL + 3, what="the restarted daemon to lead")
    assert term_of(again) > term


def in_another_kernel(daemon: Daemon, workdir: str) -> Daemon:
    """Run ``daemon`` in a private mount namespace whose boot id is another kernel's."""
    fake = Path(workdir) / "boot_id"
    fake.write_text(FAKE_BOOT_ID + "\n")
    mount = 'mount --bind "$0" /proc/sys/kernel/random/boot_id && exec "$@"'
    daemon.args = ["unshare", "--mount", "sh", "-c", mount, str(fake), *daemon.args]
    return daemon


def test_a_second_kernel_on_the_file_fails_closed_instead_of_leading(workdir: str) -> None:
    if subprocess.run(["unshare", "--mount", "true"], check=False).returncode != 0:
        pytest.skip("needs mount namespaces (unshare --mount) to play a second kernel")
    db = f"sqlite://{workdir}/lease.db"
    here = Daemon("here", db, workdir=workdir).start()
    here.wait_ready()
    wait_for(lambda: here.is_leader(), TTL + 2, what="the first daemon to lead")
    there = in_another_kernel(Daemon("there", db, workdir=workdir), workdir).start()
    there.wait_ready()
    first_term = term_of(here)
    samples = watch_leaders([here, there], 2 * TTL + 1)
    assert all(len(s) <= 1 for s in samples), [s for s in samples if len(s) > 1][:3]
    assert term_of(here) == first_term  # no churn of terms
    wait_for(lambda: "written by another kernel" in there.log(), 10, what="the refusal")
    # The refusal sticks: no later round, which sees no change of its own, forgets it.
    wait_for(lambda: role_of(there) == "unknown", 2 * TTL + 2, what="the refusal to answer")
    roles = set()
    for _ in range(int(2 * TTL / RETRY)):
        time.sleep(RETRY)
        roles.add(role_of(there))
    assert roles == {"unknown"}, roles


def test_a_deleted_lease_file_is_never_a_fresh_start(workdir: str) -> None:
    path = Path(workdir) / "lease.db"
    db = f"sqlite://{path}"
    old = Daemon("old", db, workdir=workdir).start()
    old.wait_ready()
    wait_for(lambda: old.is_leader(), TTL + 2, what="the first daemon to lead")
    term = term_of(old)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    new = Daemon("new", db, workdir=workdir).start()
    samples = watch_leaders([old, new], TTL + 1)
    assert all(len(s) <= 1 for s in samples), [s for s in samples if len(s) > 1][:3]
    # Deleted, or already replaced by the new daemon's file when the old one next looked.
    assert not old.is_leader()
    assert re.search(r"was (deleted|replaced) while in use", old.log()), old.log()[-2000:]
    wait_for(lambda: new.is_leader(), 2 * TTL + 3, what="the new file's first leader")
    assert term_of(new) > term  # the term did not restart at 1
    assert not old.is_leader()


def test_sqlite_expiry_is_judged_on_clock_boottime(workdir: str) -> None:
    """In a time namespace whose CLOCK_BOOTTIME runs 10^5 s ahead of CLOCK_MONOTONIC (as a
    host suspended that long would), the lease's expiry is written on CLOCK_BOOTTIME."""
    probe = ["unshare", "--time", "--boottime", "100000", "true"]
    if subprocess.run(probe, check=False, capture_output=True).returncode != 0:
        pytest.skip("needs time namespaces (unshare --time)")
    path = Path(workdir) / "lease.db"
    d = Daemon("sleeper", f"sqlite://{path}", workdir=workdir)
    d.args = ["unshare", "--time", "--boottime", "100000", *d.args]
    d.start()
    d.wait_ready()  # a loaded host's interpreter start is no part of the ttl (4 s, once)
    wait_for(lambda: d.is_leader(), TTL + 2, what="the daemon to lead")
    with sqlite3.connect(path) as conn:
        (expires,) = conn.execute("SELECT expires_boottime FROM leaderd_lease").fetchone()
    ours = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert 100000 - 1 < expires - ours < 100000 + TTL + 1


def test_the_daemons_clock_is_clock_boottime() -> None:
    probe = ["unshare", "--time", "--boottime", "100000", "true"]
    if subprocess.run(probe, check=False, capture_output=True).returncode != 0:
        pytest.skip("needs time namespaces (unshare --time)")
    code = (
        "import time; from leaderd.clock import SystemClock; "
        "print(SystemClock().now() - time.clock_gettime(time.CLOCK_MONOTONIC))"
    )
    out = subprocess.run(
        ["unshare", "--time", "--boottime", "100000", sys.executable, "-c", code],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout  # fmt: skip
    assert 99999 < float(out) < 100001  # suspend counts: the deadline clock is not monotonic
