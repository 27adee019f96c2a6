"""What a configuration needs of this host, checked before start by both `check-config`
and `run`: a ConfigError (exit 2, one line), never a failure after start that a restart
loop would repeat for ever (exit 1 defeats the units' RestartPreventExitStatus=2).

Nothing here connects to a backend or writes a file that stays.
"""

from __future__ import annotations

import errno
import os
import socket
import tempfile

from ..api.listener import path_problem
from .config import Config, ConfigError, listen_text


def check(config: Config) -> None:
    """Raise ConfigError for the first thing this host cannot do as configured."""
    from ..backends import BackendFatal, UnknownBackend, backend_from_url

    try:
        backend = backend_from_url(config.backend)  # parses the URL; connects to nothing
    except (UnknownBackend, BackendFatal) as exc:
        raise ConfigError(str(exc)) from None
    if config.listen is not None:
        _check_listen(*config.listen)
    problem = path_problem(config.socket)
    if problem is not None:
        raise ConfigError(problem)
    # The default file's directory is the daemon's to create (StateDirectory= with systemd).
    if config.backend.lower().startswith("sqlite:") and config.state_dir is None:
        from ..backends.sqlite.backend import SQLiteBackend

        assert isinstance(backend, SQLiteBackend)
        _check_sqlite_file(backend.path)


def _check_listen(host: str, port: int) -> None:
    """HOST resolves to an address of this host (bound here on a free port, then closed)."""
    where = listen_text((host, port))
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        if exc.errno == socket.EAI_AGAIN:
            return  # the resolver does not answer now: no verdict on the name
        raise ConfigError(f"listen {where}: {exc.strerror}") from None
    family, kind, proto, _, address = found[0]
    with socket.socket(family, kind, proto) as probe:
        try:
            probe.bind((address[0], 0, *address[2:]))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(f"listen {where}: {host} is no address of this host") from None


def _check_sqlite_file(path: str) -> None:
    """The file opens for writing, or its directory takes new files (SQLite also writes
    its -wal and -shm files there)."""
    if os.path.lexists(path):
        try:
            os.close(os.open(path, os.O_RDWR))
        except OSError as exc:
            raise ConfigError(f"SQLite file {path}: cannot open it: {exc.strerror}") from None
    directory = os.path.dirname(path)
    try:
        _probe_directory(directory)
    except OSError as exc:
        message = f"SQLite file {path}: cannot create files in {directory}: {exc.strerror}"
        raise ConfigError(message) from None


def _probe_directory(directory: str) -> None:
    """Create a file in ``directory`` and remove it: an unnamed one where the filesystem
    allows (nothing to see), else a named one unlinked at once."""
    try:
        os.close(os.open(directory, os.O_TMPFILE | os.O_RDWR, 0o600))
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR):
            raise
    fd, name = tempfile.mkstemp(prefix=".leaderd-check-", dir=directory)
    os.close(fd)
    os.unlink(name)
