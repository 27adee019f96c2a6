"""Backends, chosen by URL scheme. See base.py for the interface they share."""

from __future__ import annotations

import importlib
import urllib.parse

from .base import Backend, BackendError, BackendFatal, BackendUnavailable, Candidate, Lease
from .urls import redact_url

__all__ = [
    "Backend",
    "BackendError",
    "BackendFatal",
    "BackendUnavailable",
    "Candidate",
    "Lease",
    "UnknownBackend",
    "backend_from_url",
    "redact_url",
]

# scheme -> (module, class); imported lazily so a SQLite daemon never loads asyncpg.
_SCHEMES: dict[str, tuple[str, str]] = {
    "sqlite": ("leaderd.backends.sqlite.backend", "SQLiteBackend"),
    "static": ("leaderd.backends.static", "StaticBackend"),
    "postgresql": ("leaderd.backends.postgres.lease", "PostgresLeaseBackend"),
    "postgres": ("leaderd.backends.postgres.lease", "PostgresLeaseBackend"),
    "postgresql+advisory": ("leaderd.backends.postgres.advisory", "PostgresAdvisoryBackend"),
    "postgres+advisory": ("leaderd.backends.postgres.advisory", "PostgresAdvisoryBackend"),
    "etcd": ("leaderd.backends.etcd.backend", "EtcdBackend"),
    "etcd+https": ("leaderd.backends.etcd.backend", "EtcdBackend"),
    "kubernetes": ("leaderd.backends.kubernetes.backend", "KubernetesBackend"),
}

_FILE_SCHEMES = ("sqlite", "static")


class UnknownBackend(ValueError):
    """The URL names no backend this build knows (a configuration error)."""


def backend_from_url(url: str) -> Backend:
    """Build (not open) the backend a URL names; raise UnknownBackend or BackendFatal."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in _SCHEMES:
        known = ", ".join(sorted({s + ":" for s in _SCHEMES}))
        raise UnknownBackend(f"unknown backend {redact_url(url)!r}: expected one of {known}")
    if scheme not in _FILE_SCHEMES:
        _check_ports(url)
    module_name, class_name = _SCHEMES[scheme]
    cls: type[Backend] = getattr(importlib.import_module(module_name), class_name)
    return cls.from_url(url)


def _check_ports(url: str) -> None:
    """Every host's port is a port number: 99999 would be refused for ever, not rejected."""
    hosts = urllib.parse.urlsplit(url).netloc.rpartition("@")[2]
    for host in hosts.split(","):
        after_address = host.rpartition("]")[2] if host.startswith("[") else host
        port = after_address.rpartition(":")[2] if ":" in after_address else ""
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise BackendFatal(f"{redact_url(url)}: port {port!r} must be 1-65535")
