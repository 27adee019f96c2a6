"""The supervisor tests' cluster: daemons on one SQLite file, each running job.py.

A cluster's ``containment`` says what the host allows, as leaderd will find it: "pidns"
(this one, as it is), "cgroup" (no PID namespace, a delegated cgroup for each daemon) or
"session" (neither); tests/support/supervision/confine.py makes the last two.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tests.support.daemons import Daemon, wait_for
from tests.support.supervision.confine import delegated_cgroup, remove_cgroup
from tests.support.supervision.records import GRACE, TTL, Event, alive, events, job_command, workers

CONFINE = str(Path(__file__).with_name("confine.py"))
# What leaderd says at startup about each containment (leaderd/supervision/child.py).
SAYS = {
    "pidns": "COMMAND runs in a PID namespace of its own",
    "cgroup": "COMMAND runs in cgroup /",
    "session": "COMMAND runs in a process group with a subreaper",
}


class Cluster:
    def __init__(self, workdir: str, containment: str = "pidns") -> None:
        self.workdir = workdir
        self.containment = containment
        self.db = os.path.join(workdir, "leases.db")
        self.daemons: list[Daemon] = []
        self.cgroups: list[str] = []

    def start(self, node_id: str, *job_options: str, command: list[str] | None = None,
              backend: str | None = None, extra: tuple[str, ...] = ()) -> Daemon:  # fmt: skip
        daemon = Daemon(
            node_id,
            backend or f"sqlite:///{self.db}",
            workdir=self.workdir,
            ttl=TTL,
            extra_args=("--kill-grace", str(GRACE), *extra),
            command=command or job_command(self.workdir, *job_options),
        )
        if self.containment != "pidns":
            confine = ["--deny-unshare"]
            if self.containment == "cgroup":
                self.cgroups.append(delegated_cgroup())
                confine += ["--cgroup", self.cgroups[-1]]
            daemon.args = [sys.executable, CONFINE, *confine, "--", *daemon.args]
        self.daemons.append(daemon.start())
        return daemon

    def start_job(self, node_id: str, *options: str) -> tuple[int, list[int]]:
        """Start a daemon whose job has workers; (the job's pid, the workers' pids)."""
        daemon = self.start(node_id, *options)
        job = self.next_start()
        want = sum(1 for o in options if o.endswith("-worker"))
        pids = wait_for(lambda: len(workers(self.workdir)) == want and workers(self.workdir), 10)
        assert SAYS[self.containment] in daemon.log()
        return job.pid, pids

    def close(self) -> None:
        for daemon in self.daemons:
            if daemon.proc is not None:
                daemon.proc.wait(10)
        for cgroup in self.cgroups:
            remove_cgroup(cgroup)

    def daemon(self, node_id: str) -> Daemon:
        return next(d for d in self.daemons if d.node_id == node_id)

    def next_start(self, after: int = 0, timeout: float = 15.0) -> Event:
        """The first job start with a term above ``after``."""
        start: Event = wait_for(
            lambda: next((e for e in events(self.workdir, "start") if e.term > after), None),
            timeout,
            what=f"a job with a term above {after}",
        )
        return start


def wait_dead(pid: int, timeout: float) -> float:
    """The monotonic time ``pid`` was seen gone (polled every 10 ms); fails after ``timeout``."""
    wait_for(lambda: not alive(pid), timeout, interval=0.01, what=f"pid {pid} to die")
    return time.monotonic()
