"""The ``postgresql[+advisory]://`` URL: what leaderd reads from it, and what it must hide."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field

from . import redact_url
from .base import BackendFatal

# Query parameters leaderd reads itself; every other one goes to asyncpg, which takes
# the libpq connection parameters it knows and sends the rest as server settings (GUCs).
_OWN_PARAMS = ("table", "schema", "application_name", "connect_timeout", "takeover")
# Advisory backend: after an unreleased holder, wait out its lease, or take over at once.
TAKEOVER_MODES = ("wait", "immediate")
# libpq's values, which asyncpg checks only when it connects (exit 1, not a config error).
_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "target_session_attrs": (
        "any", "primary", "standby", "read-write", "read-only", "prefer-standby"
    ),
}  # fmt: skip
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


@dataclass(frozen=True)
class PgSettings:
    """A parsed ``postgresql[+advisory]://`` URL."""

    dsn: str  # for asyncpg only: never logged
    description: str  # redacted, safe to log and serve
    schema: str
    table: str
    application_name: str
    connect_timeout: float
    takeover: str = "wait"
    secrets: tuple[str, ...] = field(default=(), repr=False)

    @property
    def qualified_table(self) -> str:
        return f'"{self.schema}"."{self.table}"'

    @classmethod
    def from_url(cls, url: str, default_table: str) -> PgSettings:
        description = redact_url(url)
        try:
            parts = urllib.parse.urlsplit(url)
            query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        except ValueError as exc:
            raise BackendFatal(f"invalid PostgreSQL URL {description}") from exc
        _check_choices(query, description)
        own = {k: v for k, v in query if k in _OWN_PARAMS}
        rest = [(k, v) for k, v in query if k not in _OWN_PARAMS]
        schema = own.get("schema", "public")
        table = own.get("table", default_table)
        for what, name in (("schema", schema), ("table", table)):
            if not _IDENTIFIER.fullmatch(name):
                raise BackendFatal(
                    f"{description}: {what} {name!r} is not a plain identifier "
                    "(letters, digits, _; at most 63 characters)"
                )
        try:
            connect_timeout = float(own.get("connect_timeout", "10"))
        except ValueError:
            raise BackendFatal(f"{description}: connect_timeout must be a number") from None
        takeover = own.get("takeover", "wait")
        if takeover not in TAKEOVER_MODES:
            raise BackendFatal(f"{description}: takeover must be wait or immediate")
        secrets = [v for k, v in query if k == "password" and v]
        if parts.password:
            secrets += [parts.password, urllib.parse.unquote(parts.password)]
        dsn = urllib.parse.urlunsplit(
            ("postgresql", parts.netloc, parts.path, urllib.parse.urlencode(rest), "")
        )
        return cls(
            dsn=dsn,
            description=description,
            schema=schema,
            table=table,
            application_name=own.get("application_name", "leaderd"),
            connect_timeout=connect_timeout if connect_timeout > 0 else 10.0,
            takeover=takeover,
            secrets=tuple(sorted(set(secrets), key=len, reverse=True)),
        )

    def scrub(self, text: str) -> str:
        """Remove any password from a driver message (belt and braces)."""
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text.replace(self.dsn, self.description)


def _check_choices(query: list[tuple[str, str]], description: str) -> None:
    for key, value in query:
        allowed = _CHOICES.get(key)
        if allowed is not None and value not in allowed:
            raise BackendFatal(f"{description}: {key} must be one of {', '.join(allowed)}")
