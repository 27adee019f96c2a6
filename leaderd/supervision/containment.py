"""How COMMAND's process tree is held, so that all of it can be ended: three containments.

The keeper (keeper.py) uses the first of these that works on the host; this module
is standard library only, like the keeper that imports it.

In each, COMMAND runs below a *guard* (guard.py), a fork of the keeper that dies with
it and holds the lease deadline by itself.

- ``Pidns``: a PID namespace of its own, under the guard as its init (PID 1 there). When that
  init dies, the kernel SIGKILLs every process in the namespace, and the init's exit
  completes only once all of them are gone: nothing COMMAND starts can outlive the keeper,
  and no process can leave a PID namespace. Needs
  CAP_SYS_ADMIN, or (not root) an unprivileged user namespace that maps the uid to itself.
- ``Cgroup``: a group of leaderd's delegated cgroup v2 subtree; ``cgroup.kill`` kills all of it
  at once, and ``cgroup.events`` says when it is empty.
- ``Session``: a process group of its own. The guard and the keeper are child subreapers, so
  descendants that leave the group (``setsid()``, a double fork) stay theirs, and are signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

from .keeper_protocol import DEADLINE, encode

# The guard (guard.py): (its containment, argv, env, fd to report on, fd of the
# keeper's deadlines whose EOF says the keeper died).
Init = Callable[["Session", list[str], dict[str, str], int, int], NoReturn]


# ---- processes, read from /proc and signalled without pid-reuse races ----


def children(pid: int) -> list[int]:
    """The children of ``pid`` (of all its threads); [] once it is gone."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                found += map(int, f.read().split())
    return found


def signal_tree(root: int, signum: int) -> int:
    """Send ``signum`` (0: none) to every descendant of ``root``; how many are not zombies."""
    parents, todo, running = {root}, [root], 0
    while todo:
        for pid in children(todo.pop()):
            running += send(pid, parents, signum)
            parents.add(pid)
            todo.append(pid)
    return running


def send(pid: int, parents: set[int], signum: int) -> bool:
    """Signal ``pid`` if it is still a child of one of ``parents`` (a pid read from /proc may be
    reaped and reused before the signal lands, so it goes through a pidfd checked after it is
    opened). True if it runs (is not a zombie)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state, ppid = f.read().rpartition(")")[2].split()[:2]
        if int(ppid) not in parents:
            return False
        signal.pidfd_send_signal(fd, signum)
        return state != "Z"
    except OSError:
        return False
    finally:
        os.close(fd)


# ---- the few system calls the standard library lacks (Python 3.11) ----

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
_CLOCK_BOOTTIME, _TFD_TIMER_ABSTIME = 7, 1


def _check(result: int, call: str) -> None:
    if result == -1:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{call}: {os.strerror(errno)}")


def prctl(option: int, value: int) -> None:
    _check(int(_libc.prctl(option, value, 0, 0, 0)), "prctl")


def unshare(flags: int) -> None:
    _check(int(_libc.unshare(flags)), "unshare")


class _Itimerspec(ctypes.Structure):
    _fields_ = [(name, ctypes.c_long) for name in ("i_s", "i_ns", "v_s", "v_ns")]


class Timer:
    """A timerfd on CLOCK_BOOTTIME: it fires at its time even if the host slept through it,
    where a select() timeout counts monotonic time, which stops during suspend."""

    def __init__(self) -> None:
        self.fd = int(_libc.timerfd_create(_CLOCK_BOOTTIME, os.O_NONBLOCK | os.O_CLOEXEC))
        _check(self.fd, "timerfd_create")

    def arm(self, at: float) -> None:
        """Fire at ``at`` (CLOCK_BOOTTIME seconds); never if it is infinite."""
        whole, fraction = (0, 0) if math.isinf(at) else (int(at), int(at % 1 * 1e9) or 1)
        spec = _Itimerspec(0, 0, whole, fraction)  # an all-zero value disarms it
        _check(
            int(_libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None)),
            "timerfd_settime",
        )

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def why_not(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__


# ---- the three containments ----


class Session:
    """COMMAND in a process group of its own, below its guard (guard.py): a fork of
    the keeper, a child subreaper, that holds the lease deadline. Descendants that leave the
    group stay descendants of the guard (or of the keeper, once the guard is gone), and are
    signalled. The base of the other two."""

    mode = "session"

    def __init__(self, init: Init) -> None:
        self.init = init
        self.child = 0  # the keeper's child: the guard
        self.reaped = False
        self.messages: int | None = None  # the pipe the guard reports on
        self.deadline = math.inf  # the lease's self-fence deadline, as the keeper knows it
        self._orders = -1  # the guard's orders pipe: the keeper's deadlines
        self._owed = False  # a deadline the guard has not been told (its pipe was full)

    def prepare(self) -> None:
        """Raise OSError if this containment is not available here."""

    def handle(self) -> str:
        return str(self.child)

    def start(self, argv: list[str], env: dict[str, str], private: Sequence[int]) -> None:
        """Fork the guard, which starts COMMAND (in a PID namespace, as its PID 1)."""
        out_r, out_w = os.pipe()
        orders_r, orders_w = os.pipe()  # its write end lives as long as the keeper
        pid = os.fork()
        if pid == 0:
            for fd in (*private, out_r, orders_w):
                os.close(fd)
            self.init(self, argv, env, out_w, orders_r)
        os.close(out_w)
        os.close(orders_r)
        os.set_blocking(orders_w, False)  # a frozen guard must not freeze its keeper
        self.child, self.messages, self._orders = pid, out_r, orders_w

    def join(self) -> None:
        """In COMMAND's process, before exec: enter the containment."""

    def extend(self, deadline: float) -> None:
        """A new lease deadline, for the keeper's switch and the guard's."""
        self.deadline = deadline
        self._owed = True
        self.flush()

    def flush(self) -> None:
        """Pass on a deadline the guard could not take yet."""
        if not self._owed or self._orders < 0:
            return
        try:
            os.write(self._orders, encode(DEADLINE, repr(self.deadline)))  # atomic: < PIPE_BUF
        except BlockingIOError:
            return  # the guard is frozen with a full pipe: again at the keeper's next turn
        except OSError:
            pass  # the guard is gone
        self._owed = False

    def signal(self, signum: int) -> None:
        """From the keeper: signal the guard and every descendant."""
        signal_tree(os.getpid(), signum)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def forward(self, signum: int) -> None:
        if not self.reaped:  # the guard passes it on to COMMAND
            with contextlib.suppress(OSError):
                os.kill(self.child, signum)

    def empty(self) -> bool:
        """Once the keeper has no child left: is nothing else left either?"""
        return True

    def everyone(self, signum: int) -> None:
        """From the guard: signal every process of the tree but the guard."""
        signal_tree(os.getpid(), signum)


class Cgroup(Session):
    """COMMAND in a cgroup v2 group: killed all at once, its emptiness known by the kernel."""

    mode = "cgroup"

    def __init__(self, init: Init, path: str) -> None:
        super().__init__(init)
        self.path = path

    def prepare(self) -> None:
        if not os.path.exists(f"{self.path}/cgroup.kill"):
            raise OSError(0, f"{self.path}: no cgroup.kill (Linux 5.14 or later needed)")
        tester = os.fork()  # a process must be able to join it (permissions, no-internal rule)
        if tester == 0:
            try:
                self.join()
                os._exit(0)
            except BaseException:
                os._exit(1)
        if os.waitpid(tester, 0)[1] != 0:
            raise OSError(0, f"{self.path}: a process cannot join it")

    def handle(self) -> str:
        return self.path

    def join(self) -> None:
        with open(f"{self.path}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    def kill(self) -> None:
        cgroup_kill(self.path)
        super().kill()

    def empty(self) -> bool:
        return cgroup_empty(self.path)

    def everyone(self, signum: int) -> None:
        if signum == signal.SIGKILL:
            cgroup_kill(self.path)
        super().everyone(signum)


def cgroup_kill(path: str) -> None:
    """SIGKILL every process in the group and below, at once (forks cannot escape it)."""
    with contextlib.suppress(OSError), open(f"{path}/cgroup.kill", "w") as f:
        f.write("1")


def cgroup_empty(path: str) -> bool:
    try:
        with open(f"{path}/cgroup.events") as f:
            return "populated 0" in f.read().splitlines()
    except FileNotFoundError:
        return True


class Pidns(Session):
    """COMMAND in a PID namespace whose init, PID 1 there, is the guard."""

    mode = "pidns"

    def prepare(self) -> None:
        if os.geteuid() == 0:
            unshare(CLONE_NEWPID)
            return
        uid, gid = os.geteuid(), os.getegid()
        unshare(CLONE_NEWUSER | CLONE_NEWPID)  # the user namespace is what permits the other
        for name, text in (
            ("uid_map", f"{uid} {uid} 1"),
            ("setgroups", "deny"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)

    def signal(self, signum: int) -> None:
        if not self.reaped:  # the init passes SIGTERM to all; SIGKILL ends the namespace
            with contextlib.suppress(OSError):
                os.kill(self.child, signum)

    def everyone(self, signum: int) -> None:
        with contextlib.suppress(OSError):
            os.kill(-1, signum)  # from PID 1: every process of the namespace but itself


def choose(specs: Sequence[str], init: Init) -> tuple[Session, list[tuple[str, str]]]:
    """The first containment of ``specs`` that works here, and why each before it did not."""
    skipped = []
    for spec in specs:
        mode, _, path = spec.partition("=")
        tree = (
            Pidns(init)
            if mode == "pidns"
            else Cgroup(init, path)
            if mode == "cgroup"
            else Session(init)
        )
        try:
            tree.prepare()
        except OSError as exc:
            skipped.append((tree.mode, why_not(exc)))
            continue
        return tree, skipped
    return Session(init), skipped
