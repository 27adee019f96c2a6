"""Configuration: flags > environment > TOML file > defaults (README), validated once.

Every problem is a ConfigError whose message is one line an operator can act on;
the command line turns it into exit code 2.
"""

from __future__ import annotations

import difflib
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..api import params
from . import schema
from .config_values import ConfigError as ConfigError
from .config_values import seconds as _seconds
from .election_table import TIMING_KEYS, ElectionConfig, elections
from .eligibility import ENV as ENV_ELIGIBILITY
from .hook_settings import ENV as ENV_HOOKS

DEFAULT_CONFIG_FILE = "/etc/leaderd/leaderd.toml"
SOCKET_NAME = "leaderd.sock"
# (setting, environment variable); timing settings also come from LEADERD_<NAME>.
_ENV = {
    "node_id": "LEADERD_NODE_ID",
    "address": "LEADERD_ADDRESS",
    "backend": "LEADERD_BACKEND",
    "socket": "LEADERD_SOCKET",
    "socket_mode": "LEADERD_SOCKET_MODE",
    "listen": "LEADERD_LISTEN",
    "log_format": "LEADERD_LOG_FORMAT",
    "log_level": "LEADERD_LOG_LEVEL",
    "shutdown_timeout": "LEADERD_SHUTDOWN_TIMEOUT",
    "kill_grace": "LEADERD_KILL_GRACE",
    "on_exit": "LEADERD_ON_EXIT",
    "max_connections": "LEADERD_MAX_CONNECTIONS",
    "header_timeout": "LEADERD_HEADER_TIMEOUT",
    "keepalive_timeout": "LEADERD_KEEPALIVE_TIMEOUT",
    "label_pod": "LEADERD_LABEL_POD",
    **{key: f"LEADERD_{key.upper()}" for key in TIMING_KEYS},
    **ENV_ELIGIBILITY,
    **ENV_HOOKS,
}

# Read elsewhere (the file, the elections, the etcd password), or set by leaderd for its
# command (supervisor.py): a leaderd started by a job inherits those.
_OTHER_ENV = ("LEADERD_CONFIG", "LEADERD_ELECTIONS", "LEADERD_ETCD_PASSWORD",
              "LEADERD_ELECTION", "LEADERD_TERM")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Config:
    node_id: str
    address: str
    backend: str
    socket: str
    socket_mode: int
    listen: tuple[str, int] | None
    log_format: str
    log_level: str
    shutdown_timeout: float
    kill_grace: float
    on_exit: str
    elections: tuple[ElectionConfig, ...]
    config_file: str | None
    # The default SQLite file's directory, which the daemon creates; None for a given URL.
    state_dir: str | None = None
    # Open connections per listener; long polls and streams count. 10,000 watchers fit.
    max_connections: int = 16384
    # A client must finish sending a request's headers this long after it began (or after
    # it connected): bounds slow clients ("slowloris") without bounding long polls.
    header_timeout: float = 10.0
    # An idle keep-alive connection (no request in progress) is closed after this long.
    keepalive_timeout: float = 75.0
    # (key, value) of the label the leader's pod carries while it leads (Kubernetes).
    label_pod: tuple[str, str] | None = None


def load(
    flags: Mapping[str, Any], env: Mapping[str, str] | None = None, *, file: str | None = None
) -> Config:
    """Merge flags (None means "not given"), environment and the TOML file, and validate."""
    env = os.environ if env is None else env
    _check_variables(env)
    path = file or env.get("LEADERD_CONFIG") or _existing(DEFAULT_CONFIG_FILE)
    toml = read_toml(path) if path else {}
    settings = {k: v for k, v in toml.items() if k not in ("defaults", "elections")}
    given = {k: env[var] for k, var in _ENV.items() if env.get(var, "") != ""}
    given.update({k: v for k, v in flags.items() if v is not None and k in (*_ENV, "check")})
    settings.update(given)
    contested = elections(flags, env, toml, settings, given)
    backend, state_dir = _backend(settings, env)
    return Config(
        node_id=_node_id(settings, env),
        address=str(settings.get("address", "")),
        backend=backend,
        state_dir=state_dir,
        socket=str(settings.get("socket") or default_socket(env)),
        socket_mode=_mode(settings.get("socket_mode", "0660")),
        listen=_listen(settings.get("listen")),
        log_format=_choice("log_format", settings.get("log_format", "text"), ("text", "json")),
        log_level=_log_level(settings.get("log_level", "info")),
        shutdown_timeout=_seconds("shutdown_timeout", settings.get("shutdown_timeout", 10)),
        kill_grace=_kill_grace(settings.get("kill_grace"), contested),
        on_exit=_choice("on_exit", settings.get("on_exit", "release"), ("release", "restart")),
        elections=contested,
        config_file=path,
        max_connections=_count("max_connections", settings.get("max_connections", 16384)),
        header_timeout=_positive("header_timeout", settings.get("header_timeout", 10.0)),
        keepalive_timeout=_positive("keepalive_timeout", settings.get("keepalive_timeout", 75.0)),
        label_pod=_label_pod(settings.get("label_pod"), contested),
    )


def _check_variables(env: Mapping[str, str]) -> None:
    """A misspelt LEADERD_* variable is an error, not a setting silently left out."""
    known = sorted({*_ENV.values(), *_OTHER_ENV})
    for name in sorted(env):
        if name.startswith("LEADERD_") and name not in known:
            (closest,) = difflib.get_close_matches(name, known, n=1, cutoff=0)
            raise ConfigError(f"unknown environment variable {name} (did you mean {closest}?)")


def listen_text(listen: tuple[str, int] | None) -> str:
    """HOST:PORT as users write it ([::1]:4040 for IPv6); "off" without a listener."""
    if listen is None:
        return "off"
    host, port = listen
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def read_toml(path: str, *, validate: bool = True) -> dict[str, Any]:
    """The file's settings, checked against config.schema.json (unless ``validate`` is
    false: the client commands only look for ``socket``)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {_one_line(exc)}") from None
    except RecursionError:
        raise ConfigError(f"config file {path}: values nested too deeply") from None
    problem = schema.breach(data) if validate else None
    if problem:
        raise ConfigError(f"config file {path}: {problem}")
    return data


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def client_socket(flag: str | None, env: Mapping[str, str] | None = None) -> str:
    """The socket the status/watch/resign commands talk to: flag, env, config file, default."""
    env = os.environ if env is None else env
    if flag:
        return flag
    if env.get("LEADERD_SOCKET"):
        return env["LEADERD_SOCKET"]
    path = env.get("LEADERD_CONFIG") or _existing(DEFAULT_CONFIG_FILE)
    if path:
        try:
            configured = read_toml(path, validate=False).get("socket")
        except ConfigError:
            configured = None
        if configured and isinstance(configured, str):
            return str(configured)
    return default_socket(env)


def default_socket(env: Mapping[str, str]) -> str:
    if env.get("RUNTIME_DIRECTORY"):
        return str(Path(env["RUNTIME_DIRECTORY"].split(":")[0]) / SOCKET_NAME)
    if os.geteuid() == 0:
        return f"/run/leaderd/{SOCKET_NAME}"
    if env.get("XDG_RUNTIME_DIR"):
        return str(Path(env["XDG_RUNTIME_DIR"]) / SOCKET_NAME)
    return f"/tmp/leaderd-{os.geteuid()}/{SOCKET_NAME}"


def _backend(settings: Mapping[str, Any], env: Mapping[str, str]) -> tuple[str, str | None]:
    """The backend URL, and the state directory the daemon must create for it (if any).
    A bare ``static://`` keeps its terms in the state directory, so they survive restarts."""
    url = str(settings.get("backend") or "")
    if not url:
        return default_backend(env), str(default_state_dir(env))
    if url.rstrip("/").lower() in ("static:", "static:/"):
        state_dir = default_state_dir(env)
        return f"static://{state_dir / STATIC_TERM_FILE}", str(state_dir)
    return url, None


def default_backend(env: Mapping[str, str]) -> str:
    return f"sqlite://{default_state_dir(env) / 'leaderd.db'}"


STATIC_TERM_FILE = "static-terms.json"


def default_state_dir(env: Mapping[str, str]) -> Path:
    if env.get("STATE_DIRECTORY"):
        return Path(env["STATE_DIRECTORY"].split(":")[0])
    if os.geteuid() == 0:
        return Path("/var/lib/leaderd")
    home = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(home) / "leaderd"


def _node_id(settings: Mapping[str, Any], env: Mapping[str, str]) -> str:
    node_id = str(settings.get("node_id") or env.get("HOSTNAME") or socket.gethostname())
    if not params.is_node_id(node_id):
        raise ConfigError(f"node_id {node_id!r} must be {params.NODE_ID_RULE}")
    return node_id


def _count(key: str, value: Any) -> int:
    try:
        count = int(str(value))
    except ValueError:
        raise ConfigError(f"{key} must be a whole number (got {value!r})") from None
    if not 1 <= count <= 1_000_000:
        raise ConfigError(f"{key} must be between 1 and 1000000 (got {value!r})")
    return count


def _positive(key: str, value: Any) -> float:
    seconds = _seconds(key, value)
    if not seconds > 0:
        raise ConfigError(f"{key} must be a number of seconds > 0 (got {value!r})")
    return seconds


def _mode(value: Any) -> int:
    try:
        mode = value if isinstance(value, int) else int(str(value), 8)
    except ValueError:
        raise ConfigError(f"socket_mode must be octal like 0660 (got {value!r})") from None
    if not 0 <= mode <= 0o777:
        raise ConfigError(f"socket_mode must be between 0000 and 0777 (got {value!r})")
    return mode


def _listen(value: Any) -> tuple[str, int] | None:
    if value in (None, ""):
        return None
    host, sep, port = str(value).rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"listen must be HOST:PORT, e.g. 0.0.0.0:4040 (got {value!r})")
    return host.strip("[]") or "0.0.0.0", int(port)


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {', '.join(allowed)} (got {value!r})")
    return str(value)


def _log_level(value: Any) -> str:
    level = str(value).lower()
    return _choice("log_level", level, ("debug", "info", "warning", "error"))


def _kill_grace(value: Any, elections: tuple[ElectionConfig, ...]) -> float:
    """The child is stopped when only kill_grace is left of the lease, so the grace must
    fit between two renewals; the default (5s) shrinks to 60% of that room for short leases."""
    rooms = {e.name: e.timing.lease_window - e.timing.renew_interval for e in elections}
    if value is None:
        return min([5.0] + [round(room * 0.6, 3) for room in rooms.values()])
    grace = _seconds("kill_grace", value)
    for name, room in rooms.items():
        if not grace < room:
            raise ConfigError(
                f"election {name}: kill_grace ({grace:g}s) must be less than "
                f"ttl * (1 - clock_drift) - safety_margin - renew_interval ({room:.3g}s), "
                "or the child is stopped before every renewal"
            )
    return grace


def _label_pod(value: Any, elections: tuple[ElectionConfig, ...]) -> tuple[str, str] | None:
    if value in (None, ""):
        return None
    from ..backends.kubernetes.labels import parse_label

    if len(elections) > 1 and "default" not in {e.name for e in elections}:
        raise ConfigError(
            "label_pod follows the only election, or the one named default: there is neither"
        )
    try:
        return parse_label(str(value))
    except ValueError as exc:
        raise ConfigError(f"label_pod: {exc}") from None


def _existing(path: str) -> str | None:
    return path if os.path.exists(path) else None
