"""Reading what the supervised jobs (job.py) wrote, and the checks every test makes."""

from __future__ import annotations

import fcntl
import itertools
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

JOB = str(Path(__file__).with_name("job.py"))
# The lease window of the tests' timing: ttl * (1 - clock_drift) - safety_margin.
TTL, GRACE = 2.0, 0.5
LEASE_WINDOW = TTL * 0.99 - 0.2


@dataclass(frozen=True)
class Event:
    what: str
    node: str
    term: int
    at: float  # time.monotonic() of the job, comparable with the test's
    pid: int


def job_command(workdir: str, *options: str) -> list[str]:
    return [sys.executable, JOB, record_path(workdir), lock_path(workdir), *options]


def record_path(workdir: str) -> str:
    return os.path.join(workdir, "record")


def lock_path(workdir: str) -> str:
    return os.path.join(workdir, "lock")


def lock_free(workdir: str) -> bool:
    """No process of any job holds the jobs' lock: a job starting now would not say "busy"."""
    fd = os.open(lock_path(workdir), os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # drops the lock again, if it was taken
    return True


def events(workdir: str, what: str | None = None) -> list[Event]:
    try:
        text = Path(record_path(workdir)).read_text()
    except FileNotFoundError:
        return []
    found = []
    for line in text.splitlines():
        event, node, term, at, pid = line.split()
        if what is None or event == what:
            found.append(Event(event, node, int(term), float(at), int(pid)))
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` runs or is stopped; a zombie counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before or while we read
        return False


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


def children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        pass
    return found


def keeper_of(daemon: int) -> int:
    """The keeper: the one child a daemon running a command has."""
    (keeper,) = children(daemon)
    return keeper


def tree(pid: int) -> list[int]:
    """``pid`` and every descendant of it."""
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children(found[-1])
    return found


def workers(workdir: str, job: int | None = None) -> list[int]:
    """The pids of the workers (job.py --setsid-worker/--fork-worker), of one job or all."""
    found = [e for e in events(workdir) if e.what.startswith("worker-")]
    return [e.pid for e in found if job is None or e.what.endswith(f"-{job}")]


def check_one_job_at_a_time(workdir: str) -> list[Event]:
    """The invariants of every test: no overlap (flock), terms never go back, and each job's
    last sign of life comes before the next job starts. Returns the start events."""
    everything = events(workdir)
    assert not [e for e in everything if e.what == "busy"], "two jobs were alive at once"
    starts = [e for e in everything if e.what == "start"]
    for before, after in itertools.pairwise(starts):
        # A restart under the same lease keeps its term; a new holder always has a higher one.
        assert after.term > before.term or (after.term, after.node) == (before.term, before.node)
        tree = {before.pid, *workers(workdir, before.pid)}
        last = max(e.at for e in everything if e.pid in tree)
        assert last < after.at, f"job {before.pid} still wrote after job {after.pid} started"
    return starts


def kill_leftovers(workdir: str) -> None:
    """Teardown: nothing a test started may outlive it, even frozen. Only processes whose
    command line names this test's own workdir are touched."""
    mine = workdir.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if mine not in f.read():
                    continue
            os.kill(int(entry), signal.SIGKILL)
            os.kill(int(entry), signal.SIGCONT)
        except (FileNotFoundError, ProcessLookupError):
            pass
