"""python -m bench.supervision [--samples N]: how fast `run -- COMMAND`'s containment acts.

For each containment this host can give (docs/run.md, "Containment"), with the process
tests' job (tests/support/supervision/job.py) and a worker of it that left its session:

- start: from spawning a keeper to its report that the command runs (keeper alone);
- keeper SIGKILL: from SIGKILL to the keeper of a leading daemon (static backend) to the
  moment no process of the command's tree is left, polled every millisecond;
- both SIGKILL (PID namespace only; elsewhere the service manager does it): the same when
  the daemon and its keeper die together.

Prints one line per figure; no target is judged.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from leaderd.supervision.containment_probe import keeper_argv
from leaderd.supervision.keeper_protocol import Lines
from tests.support.daemons import short_tempdir, wait_for
from tests.support.supervision.cluster import Cluster
from tests.support.supervision.confine import cgroup_root
from tests.support.supervision.records import alive, events, keeper_of, kill_leftovers, workers

MODES = ("pidns", "cgroup", "session")


def keeper_start(contain: str) -> float:
    """Seconds from spawning a keeper to its "pid" report."""
    life_r, life = os.pipe()
    report, report_w = os.pipe()
    argv = keeper_argv(f"--lifeline={life_r}", f"--report={report_w}", f"--contain={contain}",
                       "--", "sleep", "60")  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, pass_fds=(life_r, report_w))
    os.close(life_r)
    os.close(report_w)
    lines, took = Lines(), float("nan")
    while select.select([report], [], [], 30)[0]:
        data = os.read(report, 4096)
        if any(word == "pid" for word, _ in lines.feed(data)):
            took = time.monotonic() - t0
            break
        if not data:
            break
    os.close(life)  # the keeper ends the command at once
    proc.wait(10)
    os.close(report)
    return took


def tree_gone_after(mode: str, kill: Callable[[int, int], None]) -> float:
    """Seconds from ``kill(daemon, keeper)`` to no process of the command's tree left."""
    cluster = Cluster(short_tempdir("ld-bench-"), mode)
    try:
        daemon = cluster.start("a", "--setsid-worker", "--fork-worker", backend="static://")
        job = cluster.next_start()
        pids = [job.pid, *wait_for(lambda: len(workers(cluster.workdir)) == 2 and
                                   workers(cluster.workdir), 10)]  # fmt: skip
        t0 = time.monotonic()
        kill(daemon.pid, keeper_of(daemon.pid))
        while any(alive(pid) for pid in pids):
            time.sleep(0.001)
        return time.monotonic() - t0
    finally:
        kill_leftovers(cluster.workdir)
        cluster.close()
        assert not events(cluster.workdir, "busy")


def kill_keeper(_daemon: int, keeper: int) -> None:
    os.kill(keeper, signal.SIGKILL)


def kill_both(daemon: int, keeper: int) -> None:
    os.kill(daemon, signal.SIGKILL)
    os.kill(keeper, signal.SIGKILL)


def line(name: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
    return (f"{name:<34} n={len(ms):<3} median {statistics.median(ms):7.1f} ms   "
            f"p90 {p90:7.1f} ms   max {ms[-1]:7.1f} ms")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.supervision", description=__doc__)
    p.add_argument("--samples", type=int, default=10)
    args = p.parse_args(argv)
    modes = [m for m in MODES if m != "cgroup" or (os.geteuid() == 0 and cgroup_root())]
    for mode in modes:
        spec = "pidns" if mode == "pidns" else "session"  # a keeper alone has no cgroup
        if mode != "cgroup":
            print(line(f"{mode}: keeper start", [keeper_start(spec) for _ in range(args.samples)]))
        gone = [tree_gone_after(mode, kill_keeper) for _ in range(args.samples)]
        print(line(f"{mode}: keeper SIGKILL -> tree gone", gone), flush=True)
        if mode == "pidns":
            both = [tree_gone_after(mode, kill_both) for _ in range(args.samples)]
            print(line(f"{mode}: both SIGKILL -> tree gone", both), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
