"""Health checks of the application beside leaderd: what a check is, and one run of it
(docs/operations.md, "Health checks"). Who may lead follows them: health.py keeps their results.

A check is written as a target, with its own timing:

- ``exec:CMD``: CMD split like a shell would, run without one; exit status 0 is healthy;
- ``http://HOST:PORT/PATH``: a GET; a 2xx status is healthy;
- ``unix:SOCKET:/PATH``: the same GET over a Unix socket;
- ``tcp://HOST:PORT``: a connection that opens is healthy.

A check that has not answered within its timeout has failed (an exec check's whole process
group is killed). A check leaderd cannot run at all (its program is missing) is a
configuration error at start, never a failure found later.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
from dataclasses import dataclass
from urllib.parse import urlsplit

OUTPUT_LIMIT = 200  # characters of a check's output kept (members, /status, history)
_KINDS = "exec:CMD, http://HOST:PORT/PATH, unix:SOCKET:/PATH or tcp://HOST:PORT"


class CheckError(ValueError):
    """A check that cannot be run as written; the message is one line."""


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """One check and its timing (seconds; thresholds are consecutive results)."""

    target: str
    interval: float = 5.0
    timeout: float = 2.0
    # Consecutive failures that make a healthy check unhealthy, and successes back.
    failures: int = 3
    successes: int = 1
    # Failures during this long after start are not counted (a slow start).
    grace: float = 0.0

    def validate(self) -> None:
        """Raise CheckError unless the timing is usable and the target can run."""
        if not (self.interval > 0 and 0 < self.timeout <= self.interval):
            raise CheckError(f"check {self.target}: needs 0 < timeout <= interval")
        if self.failures < 1 or self.successes < 1 or self.grace < 0:
            raise CheckError(f"check {self.target}: thresholds must be >= 1, grace >= 0")
        probe_of(self.target)


@dataclass(frozen=True, slots=True)
class Result:
    """One run of a check: healthy or not, and one line that says why."""

    healthy: bool
    output: str


class Probe:
    """What a check runs; ``run`` answers within ``timeout`` or fails."""

    async def attempt(self) -> Result:
        raise NotImplementedError

    async def run(self, timeout: float) -> Result:
        try:
            async with asyncio.timeout(timeout):
                return await self.attempt()
        except TimeoutError:
            return Result(False, f"no answer within {timeout:g}s")
        except OSError as exc:
            return Result(False, exc.strerror or str(exc))
        except Exception as exc:  # a check never stops leaderd, whatever its answer was
            return Result(False, f"{type(exc).__name__}: {exc}"[:OUTPUT_LIMIT])


class ExecProbe(Probe):
    def __init__(self, argv: list[str]) -> None:
        self.argv = argv

    async def attempt(self) -> Result:
        process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own group: a timeout kills what it started too
        )
        try:
            output, _ = await process.communicate()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.shield(process.wait())
            raise
        said = _last_line(output.decode(errors="replace"))
        if process.returncode == 0:
            return Result(True, said or "exit status 0")
        return Result(False, said or f"exit status {process.returncode}")


class HttpProbe(Probe):
    """A minimal HTTP/1.0 GET (no client library: the daemon imports none for a probe)."""

    def __init__(self, host: str, port: int, path: str, socket_path: str = "") -> None:
        self.host, self.port, self.path, self.socket_path = host, port, path, socket_path

    async def attempt(self) -> Result:
        if self.socket_path:
            reader, writer = await asyncio.open_unix_connection(self.socket_path)
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(f"GET {self.path} HTTP/1.0\r\nHost: {self.host}\r\n\r\n".encode())
            status = (await reader.readline()).decode(errors="replace").split(None, 2)
        finally:
            writer.close()
        if len(status) < 2 or not status[1].isdigit():
            return Result(False, "no HTTP status line in the answer")
        said = f"HTTP {status[1]}" + (f" {status[2].strip()}" if len(status) > 2 else "")
        return Result(200 <= int(status[1]) < 300, said)


class TcpProbe(Probe):
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    async def attempt(self) -> Result:
        _, writer = await asyncio.open_connection(self.host, self.port)
        writer.close()
        return Result(True, f"connected to {self.host}:{self.port}")


def probe_of(target: str) -> Probe:
    """The probe a target names; CheckError if it names none, or cannot run."""
    if target.startswith("exec:"):
        return ExecProbe(_argv(target))
    if target.startswith("unix:"):
        socket_path, sep, path = target[len("unix:") :].partition(":")
        if not (socket_path and sep and path.startswith("/")):
            raise CheckError(f"check {target!r}: write unix:SOCKET:/PATH")
        return HttpProbe("localhost", 0, path, socket_path)
    if target.startswith(("http://", "tcp://")):
        host, port, path = _host_port(target)
        return HttpProbe(host, port, path) if target.startswith("http") else TcpProbe(host, port)
    raise CheckError(f"check {target!r}: write {_KINDS}")


def _argv(target: str) -> list[str]:
    try:
        argv = shlex.split(target[len("exec:") :])
    except ValueError as exc:
        raise CheckError(f"check {target!r}: {exc}") from None
    if not argv:
        raise CheckError(f"check {target!r}: exec: names no command")
    found = shutil.which(argv[0])
    if found is None:
        raise CheckError(f"check {target!r}: {argv[0]} is not an executable program")
    return [found, *argv[1:]]


def _host_port(target: str) -> tuple[str, int, str]:
    parts = urlsplit(target)
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or parts.username or parts.password:
        raise CheckError(f"check {target!r}: write {_KINDS} (a port, no user or password)")
    path = parts.path or "/"
    return parts.hostname, port, path + (f"?{parts.query}" if parts.query else "")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:OUTPUT_LIMIT] if lines else ""
