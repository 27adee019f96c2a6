"""etcd v3 through its JSON gateway (``POST /v3/...``) over aiohttp's client, which leaderd
already ships for its API: the URL, endpoint failover, TLS and authentication (errors.py
words each failure). backend.py holds the election logic; docs/etcd.md says why this is not
a gRPC client.

A request goes to the preferred endpoint; one that refuses, times out or has no leader passes
it to the next within the same timeout, and the one that answered is preferred from then on.
Keys and values travel base64-encoded, 64-bit integers as strings (grpc-gateway's JSON).
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from ...clock import boottime
from ..base import BackendError, BackendFatal, BackendUnavailable
from ..urls import redact_url
from .errors import (
    ELSEWHERE,
    PASSWORD_ENV,
    UNAUTHENTICATED,
    EtcdError,
    answer_error,
    checked_answer,
    connection_error,
    fatal,
    loads_answer,
)

DEFAULT_PREFIX = "/leaderd/"
_PORT = 2379
_PARAMS = ("prefix", "cacert", "cert", "key")
_MAX_MESSAGE = 16 * 1024 * 1024  # one watch response; etcd caps its own at 1.5 MiB by default


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def prefix_end(prefix: str) -> str:
    """The range_end that makes a range or watch cover every key starting with ``prefix``."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1  # the prefix ends in "/", never in 0xff
    return b64(bytes(raw))


@dataclass(frozen=True)
class EtcdSettings:
    """A parsed ``etcd://`` or ``etcd+https://`` URL."""

    endpoints: tuple[str, ...]  # base URLs: http://host:port
    prefix: str
    description: str  # redacted, safe to log and serve
    user: str = ""
    password: str = field(default="", repr=False)
    cacert: str = ""
    cert: str = ""
    key: str = ""

    @classmethod
    def from_url(cls, url: str, env: dict[str, str] | None = None) -> EtcdSettings:
        base, mark, query_text = redact_url(url).partition("?")
        description = base + mark + urllib.parse.unquote(query_text)  # ?prefix=/x/, not %2Fx%2F
        usage = "expected etcd://[user@]host:port,host:port/?prefix=/leaderd/"
        try:
            parts = urllib.parse.urlsplit(url)
            query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
        except ValueError:
            raise BackendFatal(f"invalid etcd URL {description}: {usage}") from None
        scheme = parts.scheme.lower()
        userinfo, _, hosts = parts.netloc.rpartition("@")
        unknown = sorted(set(query) - set(_PARAMS))
        if unknown or parts.path not in ("", "/") or parts.fragment:
            what = f"unknown option(s) {unknown}" if unknown else "a path or fragment"
            raise BackendFatal(f"etcd URL {description} has {what}: {usage}")
        tls = {k: query.get(k, "") for k in ("cacert", "cert", "key")}
        if scheme == "etcd" and any(tls.values()):
            raise BackendFatal(f"{description}: cacert, cert and key need etcd+https://")
        if bool(tls["cert"]) != bool(tls["key"]):
            raise BackendFatal(f"{description}: a client certificate needs both cert= and key=")
        user, has_password, password = userinfo.partition(":")
        user, password = urllib.parse.unquote(user), urllib.parse.unquote(password)
        if user and not has_password:
            password = (os.environ if env is None else env).get(PASSWORD_ENV, "")
        if has_password and not user:
            raise BackendFatal(f"{description}: a password needs a user name")
        prefix = query.get("prefix", DEFAULT_PREFIX) or DEFAULT_PREFIX
        prefix = prefix if prefix.endswith("/") else prefix + "/"
        http = "https" if scheme == "etcd+https" else "http"
        endpoints = tuple(f"{http}://{_hostport(h, description)}" for h in hosts.split(","))
        return cls(endpoints, prefix, description, user, password, **tls)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for etcd+https (None for etcd://); BackendFatal if unusable."""
        if not self.endpoints[0].startswith("https:"):
            return None
        try:
            context = ssl.create_default_context(cafile=self.cacert or None)
            if self.cert:
                context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError, ValueError) as exc:
            files = ", ".join(f"{k}={v}" for k, v in self._tls_files())
            raise BackendFatal(
                f"{self.description}: unusable TLS material ({files}): {exc}"
            ) from None
        return context

    def _tls_files(self) -> list[tuple[str, str]]:
        return [
            (k, v)
            for k, v in (("cacert", self.cacert), ("cert", self.cert), ("key", self.key))
            if v
        ]


def _hostport(host: str, description: str) -> str:
    host = host.strip()
    name, port = host, str(_PORT)
    if host.startswith("["):  # [IPv6]:port
        name, _, rest = host.partition("]")
        name, port = name + "]", rest.removeprefix(":") or port
    elif ":" in host:
        name, _, port = host.rpartition(":")
    if not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise BackendFatal(f"{description}: bad etcd endpoint {host!r} (expected host:port)")
    return f"{name}:{port}"


class EtcdClient:
    """One aiohttp session to an etcd cluster, with failover between its endpoints."""

    def __init__(self, settings: EtcdSettings) -> None:
        self.settings = settings
        self.preferred = 0  # index of the endpoint requests go to first
        self.tls = settings.ssl_context()
        self._session: aiohttp.ClientSession | None = None
        self.token = ""  # the auth token, once logged in
        self._login = asyncio.Lock()
        self.on_move: Callable[[], None] | None = None  # called when the preferred endpoint changes

    @property
    def endpoint(self) -> str:
        return self.settings.endpoints[self.preferred]

    @property
    def host(self) -> str:
        """The preferred endpoint without its scheme: how messages name a member."""
        return self.endpoint.split("://", 1)[1]

    def logout(self) -> None:
        """Forget the auth token: the next request logs in again."""
        self.token = ""

    def avoid(self, endpoint: str) -> None:
        """Prefer the next endpoint if ``endpoint`` is the preferred one (it just failed)."""
        if self.endpoint == endpoint:
            self.preferred = (self.preferred + 1) % len(self.settings.endpoints)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self.tls if self.tls else False, limit=0)
            self._session = aiohttp.ClientSession(connector=connector, json_serialize=_dumps)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, path: str, body: dict[str, Any], timeout: float, doing: str) -> Any:
        """POST ``body`` to ``path`` within ``timeout``, failing over between endpoints: the
        preferred one gets half the time (a slow cluster is not a dead member), the others
        equal shares of the rest, so one that hangs leaves time for the next."""
        # Give up a moment before the caller does, so that it hears why, not just "timed out".
        give_up = boottime() + timeout - min(0.02, timeout / 10)
        endpoints = self.settings.endpoints
        errors: dict[int, BackendError] = {}
        for attempt in range(len(endpoints)):
            left = give_up - boottime()
            if left <= 0:
                break
            index, rest = (self.preferred + attempt) % len(endpoints), len(endpoints) - attempt
            share = left / (rest if attempt else min(2, rest))
            try:
                answer = await self._call_one(endpoints[index], path, body, share)
            except EtcdError as exc:
                if exc.code not in ELSEWHERE:
                    raise self._error(doing, {index: exc}) from None
                errors[index] = exc  # no leader, leader changed, timed out: ask another member
                continue
            except BackendError as exc:
                errors[index] = exc
                continue
            if index != self.preferred:
                self.preferred = index
                if self.on_move is not None:
                    self.on_move()
            return answer
        if not errors:
            errors[self.preferred] = BackendUnavailable(f"no time left (timeout {timeout:.3g}s)")
        raise self._error(doing, errors)

    def _error(self, doing: str, errors: dict[int, BackendError]) -> BackendError:
        """One line naming each member's failure in the URL's order (the same outage gives
        the same line, so the engine logs it once); fatal only if each was (TLS, login)."""
        failures = [errors[i] for i in sorted(errors)]
        message = f"{doing}: {'; '.join(str(e) for e in failures)}"
        if all(isinstance(e, BackendFatal) or fatal(e) for e in failures):
            return BackendFatal(message)
        last = failures[-1]
        if isinstance(last, EtcdError):
            return EtcdError(message, last.code)
        return BackendUnavailable(message)

    async def _call_one(
        self, endpoint: str, path: str, body: dict[str, Any], timeout: float
    ) -> Any:
        headers = await self._auth_headers(endpoint, timeout) if self.settings.user else {}
        try:
            return await self._post(endpoint, path, body, timeout, headers)
        except EtcdError as exc:
            if exc.code != UNAUTHENTICATED or not self.settings.user:
                raise
        self.logout()  # the token expired (or the member restarted): log in again, once
        headers = await self._auth_headers(endpoint, timeout)
        return await self._post(endpoint, path, body, timeout, headers)

    async def _auth_headers(self, endpoint: str, timeout: float) -> dict[str, str]:
        async with self._login:
            if not self.token:
                body = {"name": self.settings.user, "password": self.settings.password}
                try:
                    answer = await self._post(endpoint, "/v3/auth/authenticate", body, timeout, {})
                except EtcdError as exc:
                    raise self._login_error(exc) from None
                self.token = str(answer.get("token", ""))
        return {"Authorization": self.token}

    def _login_error(self, exc: EtcdError) -> BackendError:
        if "authentication failed" in str(exc) or "password" in str(exc):
            return BackendFatal(
                f"authentication as {self.settings.user!r} failed: wrong user name or password"
            )
        if "authentication is not enabled" in str(exc):
            return BackendFatal("the URL names a user but authentication is not enabled in etcd")
        return exc

    async def _post(
        self,
        endpoint: str,
        path: str,
        body: dict[str, Any],
        timeout: float,
        headers: dict[str, str],
    ) -> Any:
        host = endpoint.split("://", 1)[1]
        try:
            async with asyncio.timeout(timeout):
                async with self._http().post(
                    endpoint + path, json=body, headers=headers
                ) as response:
                    data = await response.read()
        except TimeoutError:
            raise BackendUnavailable(f"{host}: timed out") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise connection_error(host, exc) from None
        return checked_answer(host, response.status, data)

    @asynccontextmanager
    async def stream(
        self, path: str, body: dict[str, Any], connect_timeout: float
    ) -> AsyncIterator[AsyncIterator[Any]]:
        """A streaming POST to the preferred endpoint (a watch): yields its messages."""
        endpoint = self.endpoint
        host = endpoint.split("://", 1)[1]
        # The member cancels the stream when it loses its raft leader (gRPC "hasleader"), so a
        # watch never sits silently on a member cut off from the cluster.
        headers = {"Grpc-Metadata-hasleader": "true"}
        if self.settings.user:
            headers.update(await self._auth_headers(endpoint, connect_timeout))
        try:
            async with asyncio.timeout(connect_timeout):
                response = await self._http().post(endpoint + path, json=body, headers=headers)
        except TimeoutError:
            raise BackendUnavailable(f"{host}: timed out") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise connection_error(host, exc) from None
        try:
            if response.status != 200:
                raise answer_error(host, response.status, loads_answer(await response.read()))
            yield _messages(host, response)
        finally:
            response.close()


async def _messages(host: str, response: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    """The newline-delimited JSON messages of a streaming gateway response."""
    buffer = b""
    try:
        async for chunk in response.content.iter_any():
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            if len(buffer) > _MAX_MESSAGE:
                raise BackendUnavailable(f"{host}: a watch message exceeds {_MAX_MESSAGE} bytes")
            for line in lines:
                if line.strip():
                    yield loads_answer(line)
    except (aiohttp.ClientError, OSError) as exc:
        raise connection_error(host, exc) from None


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()
