"""systemd integration: sd_notify (READY, STATUS, WATCHDOG, STOPPING) and socket activation.

The notify protocol is one datagram per message to $NOTIFY_SOCKET; it is simple and
stable, so we send it directly and need no library. Without NOTIFY_SOCKET all of
this is a no-op.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping

SD_LISTEN_FDS_START = 3


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET", "")
        # A leading "@" names a socket in the abstract namespace.
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._sock: socket.socket | None = None
        self.watchdog_interval = _watchdog_interval(env)

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def ready(self, status: str) -> None:
        self._send(f"READY=1\nSTATUS={status}")

    def status(self, status: str) -> None:
        self._send(f"STATUS={status}")

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def stopping(self, status: str) -> None:
        self._send(f"STOPPING=1\nSTATUS={status}")

    def _send(self, message: str) -> None:
        if not self._address:
            return
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        # systemd gone or socket full: notifications are advisory, never fatal.
        with contextlib.suppress(OSError):
            self._sock.sendto(message.encode(), self._address)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """How often to ping: half of WATCHDOG_USEC, if the watchdog is meant for us."""
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2_000_000


def listen_fds(env: Mapping[str, str] | None = None) -> list[socket.socket]:
    """Sockets passed by systemd socket activation (LISTEN_FDS), meant for this process."""
    env = os.environ if env is None else env
    if env.get("LISTEN_PID", "") != str(os.getpid()) or not env.get("LISTEN_FDS", "").isdigit():
        return []
    count = int(env["LISTEN_FDS"])
    sockets = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count):
        os.set_inheritable(fd, False)
        sockets.append(socket.socket(fileno=fd))
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # a supervised child must not take them too
    return sockets
