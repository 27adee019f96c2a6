"""How SQLite standbys hear a commit within milliseconds, without a constant fast poll.

An inotify watch on the lease file's directory (every commit appends to the -wal file)
makes a short burst of ``PRAGMA data_version`` reads; a changed version wakes the waiters.
Only writes to the lease file's own files count: a log file beside it (a debug log writes
many lines a second) would otherwise keep every watcher in its burst.
Without inotify, ``data_version`` is polled every ``poll_interval``. A missed event only
costs latency (the engine's rounds still run), never safety.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import pathlib
import sqlite3
import struct
from contextlib import suppress

from ...clock import boottime
from .host import persist_wal

log = logging.getLogger(__name__)

_IN_MODIFY = 0x2  # from <sys/inotify.h>
_IN_Q_OVERFLOW = 0x4000  # events were lost: any of them may have been a commit
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
# The files a commit writes: the WAL, or the file itself (a checkpoint, or no WAL).
_WRITTEN_BY_COMMITS = ("", "-wal", "-journal")
# Without an inotify event, look anyway this often (a missed event only costs latency).
_IDLE_POLL_INTERVAL = 0.5
# After a write, poll fast this long: the commit becomes visible once its fsync completes.
_SETTLE_TIME = 1.0
_SETTLE_POLL_INTERVAL = 0.001


class CommitWatcher:
    """Sets ``changed`` (and replaces it) whenever another connection commits to the file,
    for as long as anyone waits (``waiters`` > 0)."""

    def __init__(self, path: str, poll_interval: float) -> None:
        self.path = path
        self.poll_interval = poll_interval
        self.waiters = 0
        self.changed = asyncio.Event()
        self._closed = False
        self._conn: sqlite3.Connection | None = None
        self._armed = asyncio.Event()
        self._warned = False
        self._task: asyncio.Task[None] | None = None

    async def arm(self) -> None:
        """Watch, and return once the watch holds its baseline version: every commit after
        this wakes the waiters. Read the lease only after it: a commit that lands between
        the read and a later baseline would be missed until the waiter's timeout."""
        if self._closed:
            return
        if self._task is None or self._task.done():
            self._armed = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._poll(self._armed))
        await self._armed.wait()

    async def close(self) -> None:
        self._closed = True
        self.wake()
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._armed.set()  # a task cancelled before its first step never set it
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def wake(self) -> None:
        """Wake every waiter now (a commit, or anything else worth a fresh read)."""
        self.changed.set()
        self.changed = asyncio.Event()

    async def _poll(self, armed: asyncio.Event) -> None:
        try:
            conn = self._conn or await self._connect()
            if conn is None:
                return  # waiters still wake on their timeout, and their reads report errors
            written = asyncio.Event()
            watch = _watch_writes(self.path, written)
            try:
                await self._poll_versions(conn, written, armed, fast=watch is None)
            finally:
                if watch is not None:
                    asyncio.get_running_loop().remove_reader(watch)
                    os.close(watch)
        finally:
            armed.set()  # a watch that ended, or never began, holds no waiter up

    async def _connect(self) -> sqlite3.Connection | None:
        try:
            self._conn = await asyncio.to_thread(
                sqlite3.connect,
                _read_write_uri(self.path),  # never create the file: only the backend does
                0,
                isolation_level=None,
                check_same_thread=False,
                uri=True,
            )
            persist_wal(self._conn, self.path)  # closing must never delete a new file's WAL
        except sqlite3.Error as exc:
            if not self._warned:  # else every wait would log it
                self._warned = True
                log.warning("SQLite file %s: standbys hear commits only at their rounds: %s",
                            self.path, exc)  # fmt: skip
            return None
        return self._conn

    async def _poll_versions(
        self, conn: sqlite3.Connection, written: asyncio.Event, armed: asyncio.Event, fast: bool
    ) -> None:
        """Poll data_version every few ms: always without inotify, else for a while after a
        write in the directory (a commit shows only after its fsync, so keep looking)."""
        last, fast_until = _data_version(conn), 0.0
        armed.set()
        while self.waiters and not self._closed:
            if fast:
                await asyncio.sleep(self.poll_interval)
            elif boottime() < fast_until:
                await asyncio.sleep(_SETTLE_POLL_INTERVAL)
            else:
                with suppress(TimeoutError):
                    await asyncio.wait_for(written.wait(), _IDLE_POLL_INTERVAL)
            wrote = written.is_set()
            if wrote:
                written.clear()
                fast_until = boottime() + _SETTLE_TIME
            # A few microseconds on the loop thread: reads the WAL index in shared memory,
            # no disk I/O while nothing changed (an aiosqlite hop would cost ~50x more CPU).
            version = _data_version(conn)
            if version is not None and version != last:
                last = version
                if not wrote:  # a write heard in this same look may be a later commit
                    fast_until = 0.0  # still in its fsync: keep looking until it shows
                self.wake()


def _read_write_uri(path: str) -> str:
    """The URI that opens the existing file at absolute ``path`` read-write. Quoted, and
    with an empty authority: "sqlite:////tmp/h.db" gives "//tmp/h.db", which as
    "file://tmp/h.db" would name a host "tmp" (SQLite refuses it)."""
    return pathlib.PurePosixPath(path).as_uri() + "?mode=rw"


def _watch_writes(path: str, written: asyncio.Event) -> int | None:
    """An inotify descriptor that sets ``written`` on a write to the SQLite file at ``path``
    or its journal; None where inotify is unavailable (then: poll). It watches the directory:
    the -wal file may not exist yet, and may be made anew."""
    libc = ctypes.CDLL(None, use_errno=True)
    init = getattr(libc, "inotify_init1", None)
    fd = -1 if init is None else int(init(os.O_NONBLOCK | os.O_CLOEXEC))
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(os.path.dirname(path)), _IN_MODIFY) < 0:
        os.close(fd)
        return None
    asyncio.get_running_loop().add_reader(fd, _drain, fd, written, _commit_files(path))
    return fd


def _commit_files(path: str) -> frozenset[bytes]:
    name = os.fsencode(os.path.basename(path))
    return frozenset(name + suffix.encode() for suffix in _WRITTEN_BY_COMMITS)


def _drain(fd: int, written: asyncio.Event, names: frozenset[bytes]) -> None:
    heard = False
    with suppress(BlockingIOError):
        while events := os.read(fd, 4096):
            heard = _names_one_of(events, names) or heard
    if heard:
        written.set()


def _names_one_of(events: bytes, names: frozenset[bytes]) -> bool:
    """Whether any inotify event in ``events`` (whole events, as read() returns them) is a
    write to one of ``names``, or says that events were lost."""
    offset = 0
    while offset + _EVENT.size <= len(events):
        _, mask, _, length = _EVENT.unpack_from(events, offset)
        start = offset + _EVENT.size
        if mask & _IN_Q_OVERFLOW or events[start : start + length].rstrip(b"\0") in names:
            return True
        offset = start + length
    return False


def _data_version(conn: sqlite3.Connection) -> int | None:
    try:
        return int(conn.execute("PRAGMA data_version").fetchone()[0])
    except sqlite3.Error:
        return None  # busy for a moment (checkpoint); try again on the next tick
