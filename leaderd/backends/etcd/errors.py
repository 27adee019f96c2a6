"""etcd's failures in an operator's words: the gateway's error answers (grpc-gateway's
``{"error", "code"}``, a stream's ``{"error": {"grpc_code", "message"}}``) and failed
connections, each one ``BackendError`` line that says what to do where etcd's words alone
do not."""

from __future__ import annotations

import os
import ssl
from typing import Any

import aiohttp
import orjson

from ..base import BackendError, BackendFatal, BackendUnavailable

PASSWORD_ENV = "LEADERD_ETCD_PASSWORD"
# gRPC status codes (the gateway's "code").
_UNKNOWN, _DEADLINE_EXCEEDED, _RESOURCE_EXHAUSTED, _UNAVAILABLE, UNAUTHENTICATED = 2, 4, 8, 14, 16
# Another member may answer: no leader, leader changed, request timed out, too many requests.
ELSEWHERE = (_UNKNOWN, _DEADLINE_EXCEEDED, _RESOURCE_EXHAUSTED, _UNAVAILABLE)
_FATAL_PHRASES = ("authentication failed", "permission denied", "user name is empty")


class EtcdError(BackendUnavailable):
    """etcd answered with an error (code: gRPC status code)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def loads_answer(data: bytes) -> Any:
    try:
        answer = orjson.loads(data) if data.strip() else {}
    except orjson.JSONDecodeError:
        return {"error": f"not a JSON answer: {data[:80]!r}"}
    return answer if isinstance(answer, dict) else {"error": f"unexpected answer {data[:80]!r}"}


def checked_answer(host: str, status: int, data: bytes) -> Any:
    """A unary call's answer; EtcdError if it is an error."""
    answer = loads_answer(data)
    if status != 200 or "error" in answer:
        raise answer_error(host, status, answer)
    return answer


def answer_error(host: str, status: int, answer: dict[str, Any]) -> EtcdError:
    error = answer.get("error")
    if isinstance(error, dict):  # a streaming call's error: {"grpc_code", "message", ...}
        message, code = str(error.get("message", "")), int(error.get("grpc_code", _UNKNOWN))
    else:
        message, code = str(answer.get("message") or error or ""), int(answer.get("code", _UNKNOWN))
    if not message:
        message = f"HTTP {status}"
        code = _UNAVAILABLE if status >= 500 else _UNKNOWN
    return EtcdError(f"{host}: {_explained(message)}", code)


def fatal(exc: BackendError) -> bool:
    return any(phrase in str(exc) for phrase in _FATAL_PHRASES)


def _explained(message: str) -> str:
    """etcd's message, with what to do about it when etcd's words alone do not say."""
    if "user name is empty" in message:
        return (f"{message} (etcd has authentication enabled: name a user in the URL, "
                f"etcd://USER@host:port, with the password in {PASSWORD_ENV})")  # fmt: skip
    if "permission denied" in message:
        return f"{message} (the user needs a role with readwrite on the prefix)"
    return message


def connection_error(host: str, exc: BaseException) -> BackendError:
    """A failed connection or exchange, in words an operator can act on."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        reason = getattr(exc.certificate_error, "verify_message", "") or str(exc.certificate_error)
        return BackendFatal(f"{host}: TLS: the server's certificate is not trusted ({reason})")
    text = str(exc)
    if "ALERT_BAD_CERTIFICATE" in text or "CERTIFICATE_REQUIRED" in text:
        return BackendFatal(
            f"{host}: TLS: the member refused our client certificate (or that there was none): "
            "give cert= and key= signed by a CA the member trusts"
        )
    if isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError):
        return BackendFatal(f"{host}: TLS handshake failed ({getattr(exc, 'reason', None) or exc})")
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_error = exc.os_error
        if isinstance(os_error, ConnectionResetError) and exc.ssl:
            return BackendUnavailable(
                f"{host}: connection reset in the TLS handshake (a member without TLS does "
                "that: use etcd://)"
            )
        reason = os.strerror(os_error.errno) if os_error.errno else type(os_error).__name__
        return BackendUnavailable(f"{host}: {reason.lower()}")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return BackendUnavailable(f"{host}: the member closed the connection")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return BackendUnavailable(f"{host}: the member broke off its answer")
    return BackendUnavailable(
        f"{host}: {type(exc).__name__}: {text}" if text else f"{host}: {type(exc).__name__}"
    )
