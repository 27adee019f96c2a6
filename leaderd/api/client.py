"""A tiny HTTP-over-Unix-socket client for the status, watch and resign commands.

Standard library only: the commands start in milliseconds and import no event loop.
"""

from __future__ import annotations

import http.client
import socket
import urllib.parse
from collections.abc import Iterator
from typing import Any

from .. import jsonio


class Unreachable(OSError):
    """No daemon answers on the socket (exit code 3)."""


class UnixConnection(http.client.HTTPConnection):
    """http.client over a Unix socket (one request per connection)."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.settimeout(self.timeout)
        self.unix.connect(self._path)
        self.sock = self.unix


def election_path(base: str, election: str | None, **query: Any) -> str:
    path = base + (f"/{urllib.parse.quote(election, safe='')}" if election else "")
    params = {k: v for k, v in query.items() if v is not None}
    return path + ("?" + urllib.parse.urlencode(params) if params else "")


DEFAULT_TIMEOUT = 10.0


def request(
    socket_path: str, method: str, path: str, timeout: float = DEFAULT_TIMEOUT
) -> tuple[int, Any]:
    """One request; (status code, decoded JSON body). Raise Unreachable if nobody answers
    within ``timeout`` seconds (a frozen daemon accepts, then never answers)."""
    conn = UnixConnection(socket_path, timeout)
    try:
        conn.request(method, path, headers={"Accept": "application/json"})
        response = conn.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise Unreachable(f"no leaderd answers on {socket_path}: {_why(exc, timeout)}") from None
    finally:
        conn.close()
    return response.status, jsonio.loads(body) if body else None


def stream(
    socket_path: str, path: str, timeout: float = DEFAULT_TIMEOUT
) -> Iterator[tuple[int, Any]]:
    """Follow an NDJSON stream: yields (status code, decoded line) until the daemon ends it.
    ``timeout`` bounds the wait for the first answer; then a quiet stream is no failure."""
    conn = UnixConnection(socket_path, timeout)
    try:
        conn.request("GET", path, headers={"Accept": "application/x-ndjson"})
        response = conn.getresponse()
        if response.status != 200:
            yield response.status, jsonio.loads(response.read() or b"null")
            return
        conn.unix.settimeout(None)  # it answered: a quiet stream is no failure
        for line in response:
            if line.strip():
                yield 200, jsonio.loads(line)
    except (OSError, http.client.HTTPException) as exc:
        raise Unreachable(f"no leaderd answers on {socket_path}: {_why(exc, timeout)}") from None
    finally:
        conn.close()


def _why(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g}s (--timeout)"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
