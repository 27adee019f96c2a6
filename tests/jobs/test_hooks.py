"""Transition hooks (`--on-elected`, `--on-demoted`, `--on-stop`) with real daemons: once per
transition, with their environment, in order across a hand-over, and the demote hook done
before the lease can expire when the backend (the suite's real PostgreSQL) goes away."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.support.daemons import REPO, Daemon, metric, short_tempdir, wait_for
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.slow

TTL = 2.0
# Each run appends: "<hook> <node> <role> <previous role> <term> <start> <end> <reason>",
# start and end on CLOCK_BOOTTIME; it sleeps argv[3] seconds in between.
HOOK = """
import os, sys, time
start = time.clock_gettime(time.CLOCK_BOOTTIME)
time.sleep(float(sys.argv[3]))
e = os.environ
line = "%s %s %s %s %s %.3f %.3f %s\\n" % (sys.argv[2], e["LEADERD_NODE_ID"], e["LEADERD_ROLE"],
    e["LEADERD_PREVIOUS_ROLE"], e["LEADERD_TERM"], start,
    time.clock_gettime(time.CLOCK_BOOTTIME), e["LEADERD_REASON"])
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
"""


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir("ld-hk-")
    with open(os.path.join(path, "hook.py"), "w") as f:
        f.write(HOOK)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def hook(workdir: str, name: str, seconds: float = 0.0) -> str:
    out = os.path.join(workdir, "hooks")
    return f"{sys.executable} {workdir}/hook.py {out} {name} {seconds}"


def hooked(
    workdir: str, node_id: str, backend: str, *extra: str, demote: float = 0.0, ttl: float = TTL
) -> Daemon:
    args = ("--on-elected", hook(workdir, "elected"), "--on-stop", hook(workdir, "stop"),
            "--on-demoted", hook(workdir, "demoted", demote), *extra)  # fmt: skip
    d = Daemon(node_id, backend, workdir=workdir, ttl=ttl, extra_args=args).start()
    d.wait_ready()
    return d


def runs(workdir: str) -> list[list[str]]:
    try:
        with open(os.path.join(workdir, "hooks")) as f:
            return [line.split(maxsplit=7) for line in f]
    except FileNotFoundError:
        return []


def test_hooks_run_once_per_transition_in_order_across_a_hand_over(workdir: str) -> None:
    backend = f"sqlite://{workdir}/lease.db"
    # A demote hook may run until the lease's deadline. At a ttl of 2 s that left it 0.77 s
    # once, which a loaded host's interpreter start and the hook's 0.5 s outlasted (killed).
    # The order is what this test judges; a graceful hand-over never waits out the ttl.
    a = hooked(workdir, "node-a", backend, demote=0.5, ttl=3 * TTL)
    wait_for(lambda: len(runs(workdir)) == 1, timeout=10, what="node-a's elected hook")
    b = hooked(workdir, "node-b", backend, ttl=3 * TTL)
    a.signal(signal.SIGTERM)
    assert a.wait() == 0
    wait_for(lambda: len(runs(workdir)) == 4, timeout=10, what="the hand-over's hooks")
    time.sleep(1.0)  # nothing more comes
    seen = runs(workdir)
    assert [r[:3] for r in seen] == [
        ["elected", "node-a", "leader"],
        ["demoted", "node-a", "stopped"],
        ["stop", "node-a", "stopped"],
        ["elected", "node-b", "leader"],
    ], seen
    elected_a, demoted_a, stop_a, elected_b = seen
    assert demoted_a[3] == "leader" and stop_a[3] == "leader" and elected_b[3] == "follower"
    assert elected_a[4] == demoted_a[4] and int(elected_b[4]) == int(elected_a[4]) + 1
    # The demote hook (0.5 s) and the stop hook were done before node-b's term began.
    assert float(stop_a[6]) <= float(elected_b[5])
    assert (
        metric(b, 'leaderd_hook_runs_total{election="default",hook="on_elected",result="ok"}') == 1
    )
    b.signal(signal.SIGTERM)
    assert b.wait() == 0


def test_a_failing_hook_is_logged_and_counted(workdir: str) -> None:
    d = Daemon("node-a", f"sqlite://{workdir}/lease.db", workdir=workdir, ttl=TTL,
               extra_args=("--on-elected", "sh -c 'exit 7'")).start()  # fmt: skip
    d.wait_ready()
    failed = 'leaderd_hook_runs_total{election="default",hook="on_elected",result="failed"}'
    wait_for(lambda: metric(d, failed) == 1, timeout=10, what="the failure counted")
    assert "on_elected hook 'sh -c 'exit 7'' for election default" in d.log()
    assert "failed with status 7" in d.log()


def test_a_demote_hook_that_cannot_fit_between_renewals_is_refused_at_start(
    workdir: str,
) -> None:
    # ttl 2, renew 0.5: the room is 2 * 0.99 - 0.2 - 0.5 = 1.28 s.
    done = subprocess.run(
        [sys.executable, "-m", "leaderd", "run", "--backend", f"sqlite://{workdir}/l.db",
         "--socket", f"{workdir}/x.sock", "--ttl", "2", "--renew-interval", "0.5",
         "--retry-interval", "0.25", "--on-demoted", "true", "--hook-timeout", "1.5"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=30,
        check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "hook_timeout (1.5s) must be less than" in done.stderr


# The demote hook below notes its start (role, reason), then, once its work is done, asks the
# daemon itself: a "leader" answer, produced after that end, puts the end before the lease
# deadline (the daemon judges is_leader from its deadline at each answer), with no reading of
# the deadline by the test that a slow answer could skew.
ASKING_HOOK = """
import os, sys
from leaderd.api.client import request
def note(text):
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (text + "\\n").encode())
note("started %s %s" % (os.environ["LEADERD_ROLE"], os.environ["LEADERD_REASON"]))
note("answered %s" % request(sys.argv[2], "GET", "/leader")[1]["role"])
"""


@pytest.mark.postgres
@pytest.mark.parametrize("gone", ["stopped", "frozen"])
def test_the_demote_hook_is_done_before_the_deadline_when_the_backend_goes_away(
    workdir: str, pg: PgServer, gone: str
) -> None:
    table = f"hooks_{uuid.uuid4().hex[:8]}"
    with open(os.path.join(workdir, "asking.py"), "w") as f:
        f.write(ASKING_HOOK)
    notes, sock = os.path.join(workdir, "notes"), os.path.join(workdir, "node-a.sock")
    # The hook's own time (an interpreter's start on a loaded machine, then one answer) must
    # fit its timeout, or it is killed at the deadline, rightly: a ttl with room for 4 s.
    args = ("--on-elected", hook(workdir, "elected"), "--hook-timeout", "4",
            "--on-demoted", f"{sys.executable} {workdir}/asking.py {notes} {sock}")  # fmt: skip
    a = Daemon("node-a", pg.dsn(table=table), workdir=workdir, ttl=6, extra_args=args).start()
    a.wait_ready()
    wait_for(lambda: len(runs(workdir)) == 1, timeout=10, what="the elected hook")
    if gone == "stopped":
        pg.stop()  # every renewal fails from now on
    else:
        pg.signal_all(signal.SIGSTOP)  # every renewal hangs unanswered from now on
    try:
        ended = re.compile(r"on_demoted hook .*\): (.*)$", re.MULTILINE)
        try:
            outcome = wait_for(lambda: ended.search(a.log()), timeout=30, what="the demote hook")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; node-a's log:\n{a.log()}") from None
        assert outcome[1] == "done", a.log()  # not killed at the deadline, not failed
        with open(notes) as f:
            seen = f.read().splitlines()
        # Started for the coming deadline, done while the node still led: before the deadline.
        assert seen[0].startswith("started follower lease deadline in"), (seen, a.log())
        assert seen[1:] == ["answered leader"], (seen, a.log())
    finally:
        a.kill()
        if gone == "frozen":
            pg.signal_all(signal.SIGCONT)
        pg.ensure_running()
        pg.psql(f"DROP TABLE IF EXISTS {table}, {table}_members, {table}_history")
        pg.psql(f"DROP FUNCTION IF EXISTS {table}_fence(text, bigint)")


def test_with_gates_the_node_answers_leader_only_after_the_elected_hook_succeeded(
    workdir: str,
) -> None:
    marker = os.path.join(workdir, "vip-up")
    elected = f"sh -c 'sleep 0.5; touch {marker}'"  # within hook_timeout (0.768 s)
    d = Daemon("node-a", f"sqlite://{workdir}/lease.db", workdir=workdir, ttl=TTL,
               extra_args=("--on-elected", elected, "--elected-hook-gates")).start()  # fmt: skip
    answers = []
    while not answers or answers[-1][0] != 200:
        code, body = d.get("/leader")
        answers.append((code, os.path.exists(marker), body and body["role"]))
        assert d.alive(), d.log()
    assert all(code != 200 or marked for code, marked, _ in answers), answers
    assert "unknown" in {role for _, _, role in answers}, answers  # held, not yet answered
    assert "answering leader once the elected hook succeeds" in d.log()


def test_with_gates_a_failing_elected_hook_hands_over(workdir: str) -> None:
    backend = f"sqlite://{workdir}/lease.db"
    fails_on_a = "sh -c 'test \"$LEADERD_NODE_ID\" != node-a'"
    extra = ("--on-elected", fails_on_a, "--elected-hook-gates")
    a = Daemon("node-a", backend, workdir=workdir, ttl=TTL, extra_args=extra).start()
    wait_for(lambda: "the elected hook failed, handing over" in a.log(), timeout=10,
             what="node-a's hook to fail")  # fmt: skip
    b = Daemon("node-b", backend, workdir=workdir, ttl=TTL, extra_args=extra).start()
    wait_for(b.is_leader, timeout=15, what="node-b to lead")
    assert "answered leader" not in a.log()
    assert a.get("/leader")[0] == 503
    failed = 'leaderd_hook_runs_total{election="default",hook="on_elected",result="failed"}'
    assert metric(a, failed) >= 1
