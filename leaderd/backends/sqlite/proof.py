"""Crash failover on one host: the kernel's proof that a SQLite lease holder's process is gone.

Before its claim commits, a holder takes an OFD lock (``F_OFD_SETLK``) on one byte of
``<file>.holder-lock`` for the election, and keeps it for as long as the lease row names it.
The claim records the proof in the row: the holder's instance and the lock file's device and
inode. The kernel drops an OFD lock only when the last descriptor of its open file
description is closed: when the holder's process dies (descriptors are close-on-exec, so no
command inherits one), never while it is frozen (SIGSTOP, cgroup freezer) or slow. A standby
that obtains the lock on the very inode the row names has the kernel's word that the holder
is gone, and takes the live lease over at once. A daemon that supervises a command records
no proof: its command may outlive it (docs/algorithm.md, "Crash failover on one host").
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import logging
import os
import stat
import struct
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass

log = logging.getLogger(__name__)

SUFFIX = ".holder-lock"


@dataclass(slots=True)
class _Watch:
    """A standby's thread blocked on a holder's lock, and what it proves once it has it."""

    proof: str
    freed: bool = False  # the thread obtained the lock: the holder of ``proof`` is gone
    told: bool = False  # a waiter has been woken for it


class HolderLock:
    """This daemon's open lock file, and its byte per election (one per table and name)."""

    def __init__(self, path: str, table: str) -> None:
        self.path = path + SUFFIX
        self.table = table
        # False while this daemon supervises a command: its leases carry no proof.
        self.enabled = True
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None
        self._watches: dict[str, _Watch] = {}
        self._seen: dict[str, tuple[str, str | None]] = {}
        self._instance = ""  # this process's, as its claims name it

    def open(self) -> None:
        """Open (or create, mode 0600) the lock file; without it, only the ttl rule."""
        if self._fd is not None:
            return
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            log.warning("holder lock %s unusable (%s): crash failover waits one ttl",
                        self.path, exc.strerror or exc)  # fmt: skip
            return
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            log.warning("holder lock %s is not a regular file: crash failover waits one ttl",
                        self.path)  # fmt: skip
            return
        self._fd, self._identity = fd, (st.st_dev, st.st_ino)

    def ask(
        self, election: str, instance: str, holder: tuple[str, str | None]
    ) -> tuple[str | None, str | None]:
        """Inside a claim's write transaction: the proof ``instance`` records (None: none),
        and the proof of the row's ``holder`` (instance, proof) its lock shows gone."""
        self._instance = instance
        mine = self.claim(election, instance)
        if holder[1] is None or holder[0] == instance:
            return mine, None
        return mine, holder[1] if self.proves_gone(election, *holder) else None

    def saw(self, election: str, instance: str, proof: str | None) -> None:
        """The lease row as last read: what a standby's ``watch`` waits on."""
        self._seen[election] = (instance, proof)

    def claim(self, election: str, instance: str) -> str | None:
        """Before a claim commits: hold the election's lock; the proof to record, or None
        when this daemon cannot (or may not) offer one."""
        if not self.enabled or self._identity is None or not self._lock(election):
            return None
        device, inode = self._identity
        return f"{instance} {device} {inode}"

    def proves_gone(self, election: str, instance: str, proof: str | None) -> bool:
        """The holder ``instance`` that recorded ``proof`` is gone: its lock, on the very
        inode it names, is now this daemon's (taken here, or by a standby's thread)."""
        return self._names_our_file(instance, proof) and self._lock(election)

    def settle(self, election: str, mine: bool) -> None:
        """After a committed write: keep the lock only while the lease row names this
        process, so a later holder can record its own proof."""
        if mine and self.enabled:
            return
        if self._fd is not None:
            with suppress(OSError):  # an unlock that fails leaves a lock: a loss of speed only
                _flock(self._fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, self.offset(election))

    def watch(self, election: str, wake: Callable[[], None]) -> None:
        """Call ``wake`` (on the loop) the moment the holder last seen with a proof dies: a
        thread blocks on its lock, whichever later holder of the election it outlives."""
        instance, proof = self._seen.get(election, ("", None))
        if proof is None or self._fd is None or instance == self._instance:
            return  # no proof, no lock file, or our own lease
        if not self._names_our_file(instance, proof):
            return  # a proof on another inode: our lock cannot tell anything about it
        current = self._watches.get(election)
        if current is not None and not current.freed:
            current.proof = proof  # still blocked: it waits for this holder as well
            return
        if current is not None and current.proof == proof:
            return  # proven already: one wake per proof
        watch = self._watches[election] = _Watch(proof)
        fd = os.dup(self._fd)  # the same description: the thread's lock is this daemon's
        args = (fd, self.offset(election), watch, asyncio.get_running_loop(), wake)
        threading.Thread(target=_wait_for_lock, args=args, daemon=True).start()

    def freed(self, election: str) -> bool:
        """Once per proof: the watched holder's lock became this daemon's."""
        watch = self._watches.get(election)
        if watch is None or not watch.freed or watch.told:
            return False
        if self._seen.get(election, ("", None))[1] != watch.proof:
            return False  # that holder's row is gone already (released, or taken)
        watch.told = True
        return True

    def offset(self, election: str) -> int:
        """The election's byte: from its table and name, so elections never share one."""
        digest = hashlib.sha256(f"{self.table}\0{election}".encode()).digest()
        return int.from_bytes(digest[:6], "big")

    def _names_our_file(self, instance: str, proof: str | None) -> bool:
        """``proof`` was recorded by ``instance`` on the inode this daemon has open."""
        if proof is None or self._identity is None:
            return False
        recorded = proof.split(" ")
        identity = [str(part) for part in self._identity]
        # Another inode: the file was replaced or deleted since; its lock proves nothing here.
        return len(recorded) == 3 and recorded[0] == instance and recorded[1:] == identity

    def close(self) -> None:
        """Drop every lock: like the process's death, so only once nothing here leads."""
        fd, self._fd, self._identity = self._fd, None, None
        if fd is not None:
            os.close(fd)

    def _lock(self, election: str) -> bool:
        assert self._fd is not None
        try:
            _flock(self._fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, self.offset(election))
        except (BlockingIOError, PermissionError):
            return False  # held by another description: its holder lives (or froze)
        except OSError as exc:
            log.warning("holder lock %s: %s: crash failover waits one ttl", self.path, exc)
            return False  # no lock, no proof (ENOLCK, a filesystem without OFD locks)
        return True


def _flock(fd: int, command: int, kind: int, offset: int) -> None:
    """fcntl on one byte with a ``struct flock`` (l_pid 0, as OFD locks require)."""
    fcntl.fcntl(fd, command, struct.pack("hhqqixxxx", kind, os.SEEK_SET, offset, 1, 0))


def _wait_for_lock(
    fd: int,
    offset: int,
    watch: _Watch,
    loop: asyncio.AbstractEventLoop,
    wake: Callable[[], None],
) -> None:
    """In a daemon thread: block until the lock is this description's, then wake the loop."""
    try:
        _flock(fd, fcntl.F_OFD_SETLKW, fcntl.F_WRLCK, offset)
    except OSError:
        return  # interrupted or closed: the ttl rule still applies
    finally:
        os.close(fd)  # the lock stays with the description the daemon still holds open
    watch.freed = True
    with suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
        loop.call_soon_threadsafe(wake)
