"""The local Unix socket: created safely, never stolen from a live daemon, removed on exit."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat


class SocketInUse(RuntimeError):
    """Another live process answers on the socket path (exit 2: never take it over)."""


class SocketPathError(RuntimeError):
    """The socket path cannot be used (bad directory, not a socket, too long)."""


# sun_path: a Unix socket's path has at most 108 bytes.
MAX_PATH_BYTES = 108


def path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a Unix socket's path; None if it can."""
    size = len(os.fsencode(path))
    if size <= MAX_PATH_BYTES:
        return None
    return (
        f"socket path {path} is {size} bytes; a Unix socket path has at most "
        f"{MAX_PATH_BYTES}: choose a shorter --socket"
    )


class UnixListener:
    """A bound, listening Unix stream socket that knows whether the path is still ours."""

    def __init__(self, sock: socket.socket, path: str, owned: bool) -> None:
        self.sock = sock
        self.path = path
        # False when systemd passed the socket in: then systemd owns the file.
        self._owned = owned
        self._inode = os.stat(path).st_ino if owned else None

    @classmethod
    def bind(cls, path: str, mode: int, backlog: int = 1024) -> UnixListener:
        problem = path_problem(path)
        if problem is not None:
            raise SocketPathError(problem)
        _prepare_directory(os.path.dirname(path) or ".")
        _remove_stale(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(path)
            os.chmod(path, mode)
            sock.listen(backlog)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise SocketInUse(f"socket {path} is in use by another process") from None
            raise SocketPathError(f"cannot listen on {path}: {exc.strerror}") from None
        sock.setblocking(False)
        return cls(sock, path, owned=True)

    @classmethod
    def adopt(cls, sock: socket.socket) -> UnixListener:
        """A socket passed by systemd socket activation."""
        sock.setblocking(False)
        return cls(sock, str(sock.getsockname()), owned=False)

    def remove(self) -> None:
        """Unlink the socket file if it is still the one we created."""
        if not self._owned:
            return
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)


def _prepare_directory(directory: str) -> None:
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise SocketPathError(
            f"cannot create socket directory {directory}: {exc.strerror}; "
            "create it or choose another path with --socket"
        ) from None
    if not os.path.isdir(directory):
        raise SocketPathError(f"socket directory {directory} is not a directory")


def _remove_stale(path: str) -> None:
    """Replace a socket left by a dead daemon; refuse one a live process answers on."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketPathError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # nobody listens: left by a daemon that died
        return
    except OSError as exc:
        raise SocketPathError(f"cannot check socket {path}: {exc.strerror}") from None
    finally:
        probe.close()
    raise SocketInUse(
        f"socket {path} is in use by a running daemon; stop it first or choose another --socket"
    )
