"""What keeps a SQLite lease file to one host: the guards the backend trusts.

docs/algorithm.md, "Assumptions", lists them with the rest; docs/sqlite.md in detail.

A SQLite lease judges expiry on this kernel's CLOCK_BOOTTIME, so every writer must share
that kernel. Each guard turns a broken assumption into a refusal, never a second leader:

* network and FUSE filesystems (NFS, CIFS, 9p, virtiofs, ...) are refused at start;
* a row written under another kernel's boot id is never "instantly expired": it is taken
  over only by the engine's one-ttl rule, and a row that keeps changing under another boot
  id is a concurrent writer from another kernel, answered by failing closed;
* the file's device and inode are checked on every request: a deleted or replaced file is
  the loss of the lease (``LeaseLost``), not a fresh start;
* every daemon holds a shared lock on the file's directory, so a daemon that must create
  the file can tell whether others still run (on a file since deleted): then the new rows
  name an unknown holder and the first acquisition waits one ttl, with terms that cannot
  repeat the old file's.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import sqlite3
from dataclasses import dataclass

from ..base import BackendFatal, LeaseLost

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
MOUNTINFO = "/proc/self/mountinfo"
# Filesystems whose locks or clocks span hosts (or a userspace daemon): never for a lease.
SHARED_FILESYSTEMS = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "virtiofs", "ceph", "glusterfs",
        "lustre", "gfs2", "ocfs2", "afs", "davfs", "sshfs", "nfsd",
    }
)  # fmt: skip
ALTERNATIVES = "use postgresql://, postgresql+advisory:// or etcd:// for daemons on several hosts"


def boot_id() -> str:
    try:
        with open(BOOT_ID_FILE) as f:
            return f.read().strip()
    except OSError as exc:
        raise BackendFatal(f"cannot read the kernel boot id from {BOOT_ID_FILE}: {exc}") from exc


def preflight(path: str) -> str:
    """Fail clearly before SQLite does; return the kernel boot id."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise BackendFatal(f"SQLite file {path}: directory {directory} does not exist")
    refuse_shared_filesystem(directory)
    return boot_id()


def filesystem_type(path: str, mountinfo: str = MOUNTINFO) -> str:
    """The type of the filesystem holding ``path`` (from the longest matching mount point)."""
    target = os.path.realpath(path)
    best, fstype = "", ""
    with open(mountinfo, encoding="utf-8", errors="replace") as f:
        for line in f:
            fields, _, rest = line.partition(" - ")
            parts = fields.split()
            if len(parts) < 5 or not rest:
                continue
            point = parts[4].replace("\\040", " ")
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, fstype = point, rest.split()[0]
    return fstype


def refuse_shared_filesystem(directory: str, mountinfo: str = MOUNTINFO) -> None:
    fstype = filesystem_type(directory, mountinfo)
    if fstype in SHARED_FILESYSTEMS or fstype.startswith("fuse"):
        raise BackendFatal(
            f"SQLite lease file directory {directory} is on a {fstype} filesystem: a SQLite "
            f"lease file serves the daemons of one host on a local disk; {ALTERNATIVES}"
        )


class DirectoryLock:
    """A shared flock on the lease file's directory for the daemon's lifetime; exclusive
    only while the file is created, so a creator knows whether anyone else is running."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock; True when no other daemon held it (nobody else is running)."""
        if self._fd is None:
            self._fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fcntl.flock(self._fd, fcntl.LOCK_SH)  # waits out a creator's brief exclusive hold
            return False
        return True

    def share(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_SH)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """The lease file as it was opened: a different device or inode later is a new file."""

    path: str
    device: int
    inode: int

    @classmethod
    def of(cls, path: str) -> FileIdentity:
        st = os.stat(path)
        return cls(path, st.st_dev, st.st_ino)

    def check(self) -> None:
        """Raise LeaseLost if the path no longer names the file this daemon opened."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise LeaseLost(
                f"SQLite lease file {self.path} was deleted while in use: refusing to lead on "
                "it or on a new file (terms would restart); restart the daemons on one file"
            ) from None
        if (st.st_dev, st.st_ino) != (self.device, self.inode):
            raise LeaseLost(
                f"SQLite lease file {self.path} was replaced while in use (inode {self.inode} "
                f"is now {st.st_ino}): refusing to lead on it; restart the daemons on one file"
            )


class ForeignWriters:
    """Notices a row that changes while it carries another kernel's boot id.

    The refusal sticks until the daemon restarts: a standby's waiter may be the read that
    sees the change, and swallows the error; the round after it sees no change, and would
    forget the refusal."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: dict[str, tuple[str, int]] = {}
        self._refusal: str | None = None

    def check(self, election: str, row_boot_id: str, version: int, my_boot_id: str) -> None:
        before = self._seen.get(election)
        self._seen[election] = (row_boot_id, version)
        changed = before is not None and before[1] != version
        if row_boot_id and row_boot_id != my_boot_id and changed and self._refusal is None:
            self._refusal = (
                f"SQLite lease file {self.path} is written by another kernel (boot id "
                f"{row_boot_id[:8]}…, this host is {my_boot_id[:8]}…): a SQLite lease file "
                f"serves the daemons of one host only; {ALTERNATIVES}; refusing until restarted"
            )
        if self._refusal is not None:
            raise BackendFatal(self._refusal)


_PERSIST_WAL = 10  # SQLITE_FCNTL_PERSIST_WAL, from sqlite3.h


def persist_wal(conn: sqlite3.Connection, path: str) -> bool:
    """Keep the -wal and -shm files when this connection closes.

    SQLite's last connection to close deletes "<file>-wal" and "<file>-shm" *by name*. If
    the lease file was deleted and a new one created meanwhile, a daemon still holding the
    old file would delete the new file's WAL on shutdown: its commits (granted terms) lost.
    With the files kept, closing touches nothing but the old inode. False where the
    library's file control cannot be reached (then the hazard is documented only).
    """
    lib = _sqlite_library()
    if lib is None:
        return False
    # CPython's connection object starts with its sqlite3* handle, right after the header.
    handle = ctypes.c_void_p.from_address(id(conn) + object.__basicsize__).value
    name = lib.sqlite3_db_filename(ctypes.c_void_p(handle), b"main")
    if not name or os.path.realpath(name.decode(errors="replace")) != os.path.realpath(path):
        return False  # not the handle we think it is: touch nothing
    flag = ctypes.c_int(1)
    control = lib.sqlite3_file_control
    return int(control(ctypes.c_void_p(handle), b"main", _PERSIST_WAL, ctypes.byref(flag))) == 0


def _sqlite_library() -> ctypes.CDLL | None:
    """The SQLite library that Python's sqlite3 module itself uses (looked up through it)."""
    try:
        import _sqlite3

        lib = ctypes.CDLL(_sqlite3.__file__)
        lib.sqlite3_db_filename.restype = ctypes.c_char_p
        lib.sqlite3_db_filename.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.sqlite3_file_control.restype = ctypes.c_int
        lib.sqlite3_file_control.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p,
        ]  # fmt: skip
    except (OSError, AttributeError, ImportError):
        return None
    return lib
