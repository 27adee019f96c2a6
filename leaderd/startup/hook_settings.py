"""The transition hooks' settings (supervision/hooks.py), read and checked once at start: a
bad one is a ValueError whose message names it (election_table.py makes it a ConfigError)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..election.timing import Timing
from ..supervision.hooks import Hooks, parse_hooks

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
HOOK_KEYS = ("on_elected", "on_demoted", "on_stop", "hook_timeout", "elected_hook_gates")
ENV = {key: f"LEADERD_{key.upper()}" for key in HOOK_KEYS}  # (setting, environment variable)


def hooks_of(name: str, settings: Mapping[str, Any], timing: Timing) -> Hooks:
    """The hooks of election ``name`` of this timing. The demote hook must be done before
    the lease can expire: it starts when only its timeout is left, so that timeout must fit
    between two renewals, as kill_grace must (its default, 5s, shrinks alike)."""
    try:
        return _hooks(settings, timing.lease_window - timing.renew_interval)
    except ValueError as exc:
        raise ValueError(f"election {name}: {exc}") from None


def _hooks(settings: Mapping[str, Any], room: float) -> Hooks:
    given = settings.get("hook_timeout")
    timeout = min(5.0, round(room * 0.6, 3)) if given is None else _positive("hook_timeout", given)
    gates = _flag("elected_hook_gates", settings.get("elected_hook_gates", False))
    hooks = parse_hooks(dict(settings), timeout, gates)
    if hooks.on_demoted and not hooks.timeout < room:
        raise ValueError(
            f"hook_timeout ({hooks.timeout:g}s) must be less than "
            f"ttl * (1 - clock_drift) - safety_margin - renew_interval ({room:.3g}s), "
            "or the demote hook runs before every renewal"
        )
    return hooks


def _positive(key: str, value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be a number of seconds (got {value!r})") from None
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{key} must be a number of seconds > 0 (got {value!r})")
    return seconds


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in _TRUE + _FALSE:
        return str(value).lower() in _TRUE
    raise ValueError(f"{key} must be true or false (got {value!r})")
