"""HTTP to the API server over aiohttp (which leaderd already ships for its own API): the one
error boundary of the kubernetes backend. Every failure leaves here as a one-line
BackendError that never carries the token: a connection refused or a timeout is
BackendUnavailable, and so are 401 (a token that expired: the next request reads the token file
again) and 403 (RBAC refuses: a RoleBinding applied after the pod started, or revoked, is
someone's change away from working, so the daemon keeps trying and says why); a request the
server calls malformed (400, 422) is BackendFatal.

The bearer token is read from its file again whenever the file changes (kubelet rotates the
projected service-account token about hourly, replacing it under the same path).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from ..base import BackendError, BackendFatal, BackendUnavailable
from .config import KubeSettings

_CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # the decoded JSON object; {} when the body is not JSON


class Conflict(BackendUnavailable):
    """409: the compare-and-swap lost (resourceVersion moved) or the object already exists."""


class KubeClient:
    def __init__(self, settings: KubeSettings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None
        self._token = settings.token
        self._token_stat: tuple[int, int, int] | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self._read_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _read_token(self) -> str:
        """The token file's content, read again only when its inode, size or mtime moved."""
        path = self.settings.token_file
        if not path:
            return self._token
        try:
            st = os.stat(path)
            stat = (st.st_ino, st.st_size, st.st_mtime_ns)
            if stat != self._token_stat:
                with open(path) as f:
                    self._token, self._token_stat = f.read().strip(), stat
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot read the token file {path}: {exc.strerror or exc}"
            ) from None
        return self._token

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self.settings.ssl_context(), limit=32)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def request(
        self, method: str, path: str, timeout: float, body: Any = None, patch: bool = False
    ) -> Answer:
        """One request; 2xx and 404 are answers, 409 raises Conflict, the rest BackendError."""
        headers = self._headers()
        data = None
        if body is not None:
            data = orjson.dumps(body)
            merge = "application/merge-patch+json"
            headers["Content-Type"] = merge if patch else "application/json"
        what = f"{method} {path}"
        client_timeout = aiohttp.ClientTimeout(
            total=max(0.001, timeout), connect=min(timeout, _CONNECT_TIMEOUT)
        )
        try:
            async with self._open().request(
                method,
                self.settings.server + path,
                data=data,
                headers=headers,
                timeout=client_timeout,
            ) as response:
                raw = await response.read()
                status = response.status
        except TimeoutError:
            raise BackendUnavailable(f"{what}: no answer within {timeout:.1f}s") from None
        except aiohttp.ClientError as exc:
            raise BackendUnavailable(f"{what}: {_reason(exc)}") from None
        except OSError as exc:
            raise BackendUnavailable(f"{what}: {exc.strerror or exc}") from None
        return _checked(what, status, raw)

    @asynccontextmanager
    async def stream(self, path: str, silent: float) -> AsyncIterator[AsyncIterator[Any]]:
        """A watch: each JSON line the server sends, decoded, until it ends the stream, or
        until it has been ``silent`` seconds (a server that vanished without a reset)."""
        what = f"watching {path.partition('?')[0]}"
        timeout = aiohttp.ClientTimeout(
            total=None, connect=_CONNECT_TIMEOUT, sock_connect=_CONNECT_TIMEOUT, sock_read=silent
        )
        try:
            async with self._open().get(
                self.settings.server + path, headers=self._headers(), timeout=timeout
            ) as response:
                if response.status != 200:
                    _checked(what, response.status, await response.read())
                yield _lines(what, response)
        except TimeoutError:
            raise BackendUnavailable(f"{what}: timed out") from None
        except aiohttp.ClientError as exc:
            raise BackendUnavailable(f"{what}: {_reason(exc)}") from None
        except OSError as exc:
            raise BackendUnavailable(f"{what}: {exc.strerror or exc}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _lines(what: str, response: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    """Split the chunked body on newlines (a Lease with its history may pass 64 KiB)."""
    buffer = b""
    async for chunk in response.content.iter_any():
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                try:
                    yield orjson.loads(line)
                except orjson.JSONDecodeError:
                    raise BackendUnavailable(f"{what}: an event that is not JSON") from None


def _checked(what: str, status: int, raw: bytes) -> Answer:
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    if 200 <= status < 300 or status == 404:
        return Answer(status, body)
    message = f"{what}: {status} {str(body.get('message', '')).strip()[:300]}".rstrip()
    if status == 409:
        raise Conflict(message)
    if status in (400, 422):
        raise BackendFatal(message)
    raise BackendUnavailable(message)  # 401, 403, 429, 5xx: try again later


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:300]


__all__ = ["Answer", "BackendError", "Conflict", "KubeClient"]
