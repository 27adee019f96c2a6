"""A stop signal during start-up (docs/operations.md, "Signals"): exit 0, whenever it comes.

leaderd blocks SIGINT and SIGTERM on its first line; the kernel keeps them pending through
the imports (a SIGINT inside orjson's initialisation crashed the daemon) until the daemon
holds them. Real daemons, real signals, spread over 0-300 ms.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from leaderd.startup.early_signals import launched_as_leaderd
from tests.support.daemons import Daemon

pytestmark = pytest.mark.slow

STOPS = (signal.SIGINT, signal.SIGTERM)
STOP_BITS = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
TRIES = 24
# Three starts at a time: the spread of signal times stays, the test takes a third as long.
AT_ONCE = 3


def delays(tries: int, spread: float = 0.3) -> list[float]:
    """Evenly over [0, spread]: every part of the start-up gets its signals."""
    return [spread * i / (tries - 1) for i in range(tries)]


def stop_signals_blocked(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigBlk:"):
                return int(line.split()[1], 16) & STOP_BITS == STOP_BITS
    return False


def first_line_ran(d: Daemon, timeout: float = 30.0) -> None:
    """Until leaderd's first line blocked the stop signals (polled without sleeping: the
    block lasts only as long as the imports)."""
    deadline = time.monotonic() + timeout
    while not stop_signals_blocked(d.pid):
        assert d.alive(), f"exited before blocking the stop signals:\n{d.log()}"
        assert time.monotonic() < deadline, "the stop signals were never blocked"


def assert_clean_exit(d: Daemon, signum: int, delay: float) -> None:
    code = d.wait(30)
    log = d.log()
    what = f"{signal.Signals(signum).name} after {delay * 1000:.0f} ms: exit {code}\n{log}"
    assert code == 0, what
    assert "Traceback" not in log and "Fatal Python error" not in log, what


def at_once(attempt: Callable[[int, float], None], tries: int) -> None:
    """``tries`` starts, a few at a time: each waits mostly on its own daemon's start-up."""
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        list(pool.map(attempt, range(tries), delays(tries)))


def test_stop_signals_from_leaderds_first_line_exit_0(workdir: str) -> None:
    """On main the stop signals were never blocked, and SIGTERM before the daemon's own
    handler killed it (exit -15)."""

    def attempt(i: int, delay: float) -> None:
        signum = STOPS[i % 2]
        d = Daemon(f"early-{i}", "static://", workdir=workdir).start()
        first_line_ran(d)
        time.sleep(delay)
        d.signal(signum)
        assert_clean_exit(d, signum, delay)

    at_once(attempt, TRIES)


def test_a_launcher_that_blocks_stop_signals_closes_the_interpreters_window(
    workdir: str,
) -> None:
    """Before leaderd's first line the interpreter starts (tens of ms, more on a busy
    machine): a launcher that starts leaderd with the stop signals blocked closes that
    window too (as `env --block-signal` does), and leaderd lets them through itself."""

    def attempt(i: int, delay: float) -> None:
        signum = STOPS[i % 2]
        d = Daemon(f"launched-{i}", "static://", workdir=workdir)
        # Per thread: the child inherits the mask of the thread that starts it.
        before = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        try:
            d.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
        time.sleep(delay)
        d.signal(signum)
        assert_clean_exit(d, signum, delay)

    at_once(attempt, TRIES // 2)


def test_client_commands_stop_on_ctrl_c_as_usual(workdir: str) -> None:
    """Only `run` holds the stop signals; `leaderd watch` ends on SIGINT with 130."""
    d = Daemon("watched", "static://", workdir=workdir).start()
    d.wait_ready()
    watcher = Daemon("watcher", "static://", workdir=workdir)
    # As from a terminal: a launcher run in the background (`make test &`) passes Ctrl-C on
    # ignored, and Python, like every program, leaves an inherited SIG_IGN alone.
    watcher.args = ["env", "--default-signal=INT", *d.args[:3], "watch", "--socket", d.socket]
    watcher.start()
    time.sleep(0.5)  # any moment: before or after it connected, Ctrl-C ends it
    watcher.signal(signal.SIGINT)
    try:
        code = watcher.wait(30)
    except subprocess.TimeoutExpired:  # once in a loaded run: say where the signal went
        pytest.fail(f"SIGINT did not end `leaderd watch`: {signal_state(watcher.pid)}\n"
                    f"{watcher.log()}")  # fmt: skip
    assert code == 130, watcher.log()
    assert d.stop() == 0


def signal_state(pid: int) -> str:
    """The process's pending, blocked, ignored and caught signal masks, and its wait."""
    with open(f"/proc/{pid}/status") as f:
        masks = [line.strip() for line in f if line.startswith(("Sig", "ShdPnd"))]
    with open(f"/proc/{pid}/wchan") as f:
        return f"{masks}, wchan {f.read()}"


@pytest.mark.parametrize(
    ("argv", "launched"),
    [
        (["/usr/bin/python3", "/usr/bin/leaderd", "run"], True),
        (["python3", "-m", "leaderd", "run"], True),
        (["python3", "-I", "-mleaderd"], True),
        (["python3", "-X", "importtime", "-m", "leaderd.__main__"], True),
        (["python3", "-m", "pytest", "tests"], False),
        (["python3", "-c", "import leaderd", "leaderd"], False),
        (["python3", "/usr/bin/leaderd-tool"], False),
        (["python3"], False),
    ],
)
def test_only_the_leaderd_program_blocks_at_its_first_line(argv: list[str], launched: bool) -> None:
    """A program that imports leaderd (the test suite, a script) keeps its signals."""
    assert launched_as_leaderd(argv) is launched
    assert not stop_signals_blocked(os.getpid())
