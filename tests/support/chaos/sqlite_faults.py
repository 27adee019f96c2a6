"""The SQLite backend's equivalents of per-request faults, on one host.

* ``db_lock`` (harness.py): another process holds the write lock, 0.2 s-2 ttl;
* ``frozen_commit``: the daemon is SIGSTOPped while it holds the write lock (between its read
  and its commit, seen in ``/proc/locks``); SIGCONT as for ``sigstop``;
* ``fsync_stall``: every fsync of the daemon blocks for 0.2 s-2 ttl (an LD_PRELOAD shim
  compiled with ``cc`` at start; without a compiler the kind is left out).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .check import Fault
    from .node import Node
    from .settings import Settings

SQLITE_FAULTS = ("frozen_commit", "fsync_stall")
STALL_FLAG = "CHAOS_FSYNC_STALL"  # the shim blocks every fsync while this file exists

# fsync and fdatasync wait while the flag file exists, then do their work.
_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

static void stall(void) {
    const char *flag = getenv("STALL_FLAG");
    while (flag && access(flag, F_OK) == 0) usleep(5000);
}
int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    stall();
    return real(fd);
}
int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    stall();
    return real(fd);
}
""".replace("STALL_FLAG", STALL_FLAG)


def build_fsync_shim(workdir: str) -> str | None:
    """The shim's path, or None when there is no C compiler."""
    cc = shutil.which("cc")
    if cc is None:
        return None
    source, shim = os.path.join(workdir, "fsync_stall.c"), os.path.join(workdir, "fsync_stall.so")
    Path(source).write_text(_SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-o", shim, source, "-ldl"], check=True)
    return shim


def stall_flag(workdir: str, node_id: str) -> str:
    return os.path.join(workdir, f"fsync-stall-{node_id}")


def write_lock_holder(shm: str) -> int | None:
    """The pid holding the WAL write lock (byte 120 of the -shm file), if any."""
    try:
        inode = os.stat(shm).st_ino
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 120 120"
        if len(fields) < 8 or fields[1] != "POSIX" or fields[3] != "WRITE":
            continue
        if fields[5].rsplit(":", 1)[-1] == str(inode) and fields[6] == "120":
            return int(fields[4])
    return None


def _wait_for_write_lock(shm: str, pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if write_lock_holder(shm) == pid:
            return True
        time.sleep(0.0005)
    return False


class SqliteFaults:
    """Mixed into the harness's Chaos."""

    s: Settings
    rng: random.Random
    workdir: str
    nodes: list[Node]

    if TYPE_CHECKING:

        def _node(self, fault: Fault) -> Node: ...
        def _pause(self) -> float: ...
        def _restart(self, node: Node) -> None: ...

    async def _fault_frozen_commit(self, fault: Fault) -> None:
        """SIGSTOP the daemon the moment it is seen holding the write lock."""
        node = self._node(fault)
        shm = os.path.join(self.workdir, "lease.db-shm")
        fault.params["stopped_s"] = pause = round(self._pause(), 3)
        node.stopped = True
        try:
            caught = await asyncio.to_thread(
                _wait_for_write_lock, shm, node.daemon.pid, 4 * self.s.ttl
            )
            fault.params["caught"] = caught
            if caught:
                os.kill(node.daemon.pid, signal.SIGSTOP)
                fault.injected = time.monotonic()
                await asyncio.sleep(pause)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.daemon.pid, signal.SIGCONT)
            node.stopped = False
        fault.healed = time.monotonic()

    async def _fault_fsync_stall(self, fault: Fault) -> None:
        node = self._node(fault)
        fault.params["stalled_s"] = hold = round(self.rng.uniform(0.2, 2 * self.s.ttl), 3)
        flag = Path(stall_flag(self.workdir, node.id))
        node.busy = True
        await asyncio.to_thread(flag.touch)
        try:
            await asyncio.sleep(hold)
        finally:
            await asyncio.to_thread(flag.unlink, True)
        node.busy, fault.healed = False, time.monotonic()

    async def _fault_db_lock(self, fault: Fault) -> None:
        """Another process holds the SQLite write lock (a backup, a careless sqlite3 shell, a
        writer in BEGIN IMMEDIATE)."""
        fault.params["locked_s"] = hold = round(self.rng.uniform(0.2, 2 * self.s.ttl), 3)
        fault.params["begin"] = begin = self.rng.choice(("IMMEDIATE", "EXCLUSIVE"))
        path = os.path.join(self.workdir, "lease.db")
        locked, fault.healed = await asyncio.to_thread(_hold_write_lock, path, hold, begin)
        fault.injected = locked

    async def _fault_file_replaced(self, fault: Fault) -> None:
        """An operator deletes the lease file under running daemons, then restarts them one
        by one: nobody may lead on the deleted file beside a leader on the new one."""
        path = os.path.join(self.workdir, "lease.db")
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + suffix)
        await asyncio.sleep(self.rng.uniform(0.2, self.s.ttl))
        for node in self.nodes:
            if node.daemon.alive() and not node.stopped and not node.down:
                node.down = True
                node.daemon.signal(signal.SIGTERM)
                if await node.exited(15) is None:
                    node.daemon.kill()
                self._restart(node)
        fault.healed = time.monotonic()


def _hold_write_lock(path: str, hold: float, begin: str) -> tuple[float, float]:
    conn = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        conn.execute(f"BEGIN {begin}")
        locked = time.monotonic()
        time.sleep(hold)
        conn.execute("ROLLBACK")
        return locked, time.monotonic()
    finally:
        conn.close()
