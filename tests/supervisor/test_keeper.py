"""The keeper on its own: started exactly as leaderd starts it, driven through its line
protocol (leaderd/supervision/keeper.py), with real commands, real signals and every containment."""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaderd.clock import boottime
from leaderd.supervision.containment_probe import keeper_argv
from leaderd.supervision.guard import kill_at, term_at
from leaderd.supervision.keeper import switch_at
from leaderd.supervision.keeper_protocol import DEADLINE, SIGNAL, STOP
from tests.support.daemons import short_tempdir, wait_for
from tests.support.supervision.cluster import CONFINE
from tests.support.supervision.confine import cgroup_root, delegated_cgroup, remove_cgroup
from tests.support.supervision.records import alive, children, kill_leftovers

from .keepers import Keeper, start

MODES = ["session", "pidns", "cgroup"]
NO_NAMESPACES = (sys.executable, CONFINE, "--deny-unshare", "--")
SUSPENDED = 100_000.0  # seconds a host slept: CLOCK_BOOTTIME counted them, monotonic did not


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir("ld-kp-")
    yield path
    kill_leftovers(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=MODES)
def contain(request: pytest.FixtureRequest) -> Iterator[str]:
    """A --contain spec, once per containment."""
    if request.param != "cgroup":
        yield request.param
        return
    if os.geteuid() != 0 or cgroup_root() is None:
        pytest.skip("a test cgroup needs root and a writable cgroup v2 hierarchy")
    group = delegated_cgroup()
    os.mkdir(f"{group}/command")
    try:
        yield f"cgroup={group}/command"
    finally:
        remove_cgroup(group)


@pytest.fixture
def keepers(workdir: str) -> Iterator[list[Keeper]]:
    started: list[Keeper] = []
    yield started
    for keeper in started:
        keeper.close()


def test_stop_ends_the_whole_tree_then_reports(keepers: list[Keeper], workdir: str,
                                               contain: str) -> None:  # fmt: skip
    k = start(keepers, workdir, "worker", contain=contain)
    mode = contain.partition("=")[0]
    assert k.wait_for("contained").split()[0] == mode
    command, (worker,) = k.running()
    k.say(STOP)
    # The command dies of SIGTERM; the worker ignores it and gets SIGKILL after the grace.
    assert k.wait_for("exit") == "-15 stop"
    assert not alive(command) and not alive(worker), "reported before the tree was gone"
    assert k.proc.wait(5) == 128 + signal.SIGTERM


def test_a_command_ignoring_sigterm_is_killed_after_the_grace(keepers: list[Keeper],
                                                              workdir: str) -> None:  # fmt: skip
    k = start(keepers, workdir, "ignore-term", contain="pidns", grace=0.5)
    k.running(worker=False)
    asked = time.monotonic()
    k.say(STOP)
    assert k.wait_for("exit") == "-9 stop"
    took = time.monotonic() - asked
    assert 0.5 <= took < 2.0, took


def test_exit_code_passes_through_and_leftovers_are_ended(keepers: list[Keeper], workdir: str,
                                                          contain: str) -> None:  # fmt: skip
    k = start(keepers, workdir, "worker", "exit", contain=contain, grace=0.5)
    _, (worker,) = k.running()
    assert k.wait_for("exit") == "7 exited"
    assert not alive(worker), "a worker left behind by a finished command"


def test_dead_mans_switch_on_boottime(keepers: list[Keeper], workdir: str, contain: str) -> None:
    """No word from leaderd: SIGTERM just after deadline - grace, SIGKILL at the deadline."""
    k = start(keepers, workdir, "worker", contain=contain, deadline=boottime() + 2.0, grace=0.5)
    _, (worker,), deadline = k.running_renewed(2.0)
    assert k.wait_for("exit", timeout=10) == "-15 deadline"
    ended = boottime()
    assert deadline - 0.5 < ended < deadline + 0.2, ended - deadline
    assert not alive(worker)


def test_the_dead_mans_switch_counts_suspend(keepers: list[Keeper], workdir: str) -> None:
    """In a time namespace whose CLOCK_BOOTTIME runs 10^5 s ahead of CLOCK_MONOTONIC, as on a
    host that slept that long, a deadline on CLOCK_BOOTTIME still comes on time."""
    suspend = ("unshare", "--time", "--boottime", str(int(SUSPENDED)))
    if subprocess.run([*suspend, "true"], capture_output=True, check=False).returncode:
        pytest.skip("needs time namespaces (unshare --time)")
    k = start(keepers, workdir, contain="session", deadline=boottime() + SUSPENDED + 2.0,
              grace=0.5, wrap=suspend)  # fmt: skip
    *_, deadline = k.running_renewed(2.0, worker=False, ahead=SUSPENDED)
    assert k.wait_for("exit", timeout=10) == "-15 deadline"
    assert boottime() + SUSPENDED < deadline + 0.2


def test_a_deadline_sent_while_it_starts_counts(keepers: list[Keeper], workdir: str) -> None:
    """leaderd renews while a slow keeper starts, and says so at once: the keeper must read
    that before it judges its switch, or it takes leaderd for frozen and ends the command."""
    later = ((DEADLINE, repr(boottime() + 60)),)  # said before the keeper starts, not raced
    k = start(keepers, workdir, contain="pidns", deadline=boottime() + 0.3, grace=0.5,
              told=later)  # fmt: skip
    command, _ = k.running(worker=False)
    time.sleep(1.0)
    assert alive(command), k.seen


def test_a_later_deadline_keeps_the_command(keepers: list[Keeper], workdir: str) -> None:
    """The short deadline is told once the command runs, not on the command line: however
    long the start took, the later one follows it within microseconds."""
    k = start(keepers, workdir, contain="pidns", deadline=boottime() + 3600, grace=0.5)
    command, _ = k.running(worker=False)
    k.say(DEADLINE, repr(boottime() + 1.5))
    k.say(DEADLINE, repr(boottime() + 60))
    time.sleep(1.6)
    assert alive(command)
    # A keeper that ignored what it was told would also pass the above: this one must act.
    k.say(DEADLINE, repr(boottime()))
    wait_for(lambda: not alive(command), 10, interval=0.005)


@pytest.mark.parametrize("grace", [0.01, 0.5, 5.0, 60.0])
def test_the_guard_acts_last_and_is_done_before_the_deadline(grace: float) -> None:
    """leaderd SIGTERMs at deadline - grace, then the keeper, then the guard; the guard's
    SIGKILL comes before the deadline, so its end is complete when the deadline comes."""
    deadline = boottime() + 100.0
    order = [deadline - grace, switch_at(deadline, grace), term_at(deadline, grace)]
    assert order == sorted(order) and len(set(order)) == 3
    assert order[-1] < kill_at(deadline, grace) < deadline


def test_the_guard_holds_the_deadline_when_the_keeper_is_frozen(keepers: list[Keeper],
                                                                workdir: str,
                                                                contain: str) -> None:  # fmt: skip
    """leaderd and the keeper both frozen: the guard (the init of the namespace, or without
    one the command's parent) ends the whole tree by itself, and says so once the keeper can
    listen again."""
    k = start(keepers, workdir, "worker", contain=contain, deadline=boottime() + 2.0, grace=0.5)
    command, (worker,), deadline = k.running_renewed(2.0)
    os.kill(k.proc.pid, signal.SIGSTOP)  # leaderd's renewals stop with it
    try:
        wait_for(lambda: not alive(command) and not alive(worker), 10, interval=0.005)
        gone = boottime()
    finally:
        os.kill(k.proc.pid, signal.SIGCONT)
    assert k.wait_for("exit") == "-15 guard"
    print(f"{contain}: keeper frozen, the guard ended the tree {deadline - gone:.3f}s before")


def test_a_later_deadline_reaches_the_init(keepers: list[Keeper], workdir: str) -> None:
    k = start(keepers, workdir, contain="pidns", deadline=boottime() + 1.5, grace=0.5)
    command, _, deadline = k.running_renewed(1.5, worker=False)
    k.say(DEADLINE, repr(boottime() + 60))
    k.say(SIGNAL, int(signal.SIGHUP))  # read after the deadline: the init has the deadline
    wait_for(lambda: k.pids("hup"), 5)
    os.kill(k.proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: boottime() > deadline + 0.5, 5)
        assert alive(command), "the init ended the command at a deadline moved later"
    finally:
        os.kill(k.proc.pid, signal.SIGCONT)


def test_lifeline_eof_kills_everything_at_once(keepers: list[Keeper], workdir: str,
                                               contain: str) -> None:  # fmt: skip
    k = start(keepers, workdir, "worker", "ignore-term", contain=contain, grace=30)
    command, (worker,) = k.running()
    os.close(k.life)  # leaderd is gone: no grace for anyone
    assert k.wait_for("exit") == "-9 orphaned"
    assert not alive(command) and not alive(worker)


def test_keeper_killed_takes_the_namespace_with_it(keepers: list[Keeper], workdir: str) -> None:
    k = start(keepers, workdir, "worker", contain="pidns")
    command, (worker,) = k.running()
    killed = time.monotonic()
    k.proc.kill()
    wait_for(lambda: not alive(command) and not alive(worker), 5, interval=0.005)
    print(f"keeper SIGKILLed: its PID namespace gone in {time.monotonic() - killed:.3f}s")


def test_guard_killed_is_lost_not_the_commands_exit(keepers: list[Keeper], workdir: str,
                                                     contain: str) -> None:  # fmt: skip
    """The init of the namespace, or the command's parent elsewhere: the worker that left the
    command is ended all the same (by the kernel, else by the keeper it was handed to)."""
    k = start(keepers, workdir, "worker", "ignore-term", contain=contain, grace=30)
    _, (worker,) = k.running()
    (guard,) = children(k.proc.pid)
    os.kill(guard, signal.SIGKILL)
    assert k.wait_for("exit") == "-9 lost"
    assert not alive(worker)


def test_an_init_leaderd_killed_while_the_keeper_was_frozen_is_no_loss(
    keepers: list[Keeper], workdir: str
) -> None:
    """leaderd says stop, the keeper is frozen, leaderd kills the init itself (docs/run.md);
    the keeper, resumed, must read the stop before it judges the init's death."""
    k = start(keepers, workdir, "worker", contain="pidns")
    init = int(k.wait_for("contained").split()[1])
    k.running()
    os.kill(k.proc.pid, signal.SIGSTOP)
    try:
        k.say(STOP)
        os.kill(init, signal.SIGKILL)
        time.sleep(0.2)
    finally:
        os.kill(k.proc.pid, signal.SIGCONT)
    assert k.wait_for("exit") == "-9 stop"


def test_signals_are_passed_to_the_command_only(keepers: list[Keeper], workdir: str,
                                                contain: str) -> None:  # fmt: skip
    k = start(keepers, workdir, "worker", contain=contain)
    k.running()
    k.say(SIGNAL, int(signal.SIGHUP))
    wait_for(lambda: k.pids("hup"), 5)
    assert k.pids("hup") == k.pids("command")


def test_a_command_that_cannot_start(keepers: list[Keeper], workdir: str, contain: str) -> None:
    k = start(keepers, workdir, contain=contain, command=(f"{workdir}/missing",))
    assert k.wait_for("error") == "No such file or directory"
    assert k.wait_for("exit").startswith("127 ")
    assert k.proc.wait(5) == 127


def test_without_namespaces_it_falls_back_and_says_why(keepers: list[Keeper], workdir: str) -> None:
    k = start(keepers, workdir, contain="pidns", wrap=NO_NAMESPACES)
    assert k.wait_for("skipped") == "pidns unshare: Operation not permitted"
    assert k.wait_for("contained").split()[0] == "session"
    k.running(worker=False)


def test_not_root_a_user_namespace_makes_the_pid_namespace(keepers: list[Keeper],
                                                            workdir: str) -> None:  # fmt: skip
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    os.chmod(workdir, 0o777)
    k = start(keepers, workdir, "worker", contain="pidns", user="65534")
    assert k.wait_for("contained").split()[0] == "pidns"
    command, (worker,) = k.running()
    assert os.stat(f"/proc/{command}").st_uid == 65534, "its own uid, mapped to itself"
    k.say(STOP)
    assert k.wait_for("exit") == "-15 stop"
    assert not alive(worker)


def test_the_keeper_is_standard_library_only() -> None:
    """It runs as `python -I -S`: nothing from site-packages, nothing from the environment."""
    for module in ("keeper", "keeper_protocol", "guard", "containment"):
        tree = ast.parse(Path(f"leaderd/supervision/{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: only the keeper's own modules
                    ours = [node.module] if node.module else [a.name for a in node.names]
                    assert set(ours) <= {"keeper_protocol", "guard", "containment"}, ours
                    continue
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in sys.stdlib_module_names, f"{module}: {name}"


def test_a_keeper_started_without_stdout_gives_none_of_its_fds_to_the_command(
    workdir: str, contain: str
) -> None:
    """With fd 1 closed, the keeper's first fd would be fd 1: the command's stdout."""
    life_r, life = os.pipe()
    report, report_w = os.pipe()
    script = f"echo hello || touch {workdir}/broken; touch {workdir}/done; sleep 60"
    argv = keeper_argv(f"--lifeline={life_r}", f"--report={report_w}", f"--contain={contain}",
                       "--", "sh", "-c", script)  # fmt: skip
    proc = subprocess.Popen(argv, pass_fds=(life_r, report_w), preexec_fn=lambda: os.close(1))
    os.close(life_r)
    os.close(report_w)
    try:
        wait_for(lambda: Path(workdir, "done").exists(), 10)
        assert not Path(workdir, "broken").exists(), "the command's stdout was the keeper's"
    finally:
        os.close(life)  # the keeper ends the command
        proc.wait(10)
        os.close(report)
