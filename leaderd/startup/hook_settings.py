"""The transition hooks' settings (supervision/hooks.py), read and checked once at start: a
bad one is a ValueError whose message names it (config.py makes it a ConfigError)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..election.timing import Timing
from ..supervision.hooks import Hooks, parse_hooks

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
# (setting, environment variable)
ENV = {key: f"LEADERD_{key.upper()}" for key in
       ("on_elected", "on_demoted", "on_stop", "hook_timeout", "elected_hook_gates")}  # fmt: skip


def hooks_of(settings: Mapping[str, Any], timings: Mapping[str, Timing]) -> Hooks:
    """The hooks, for elections of these timings. The demote hook must be done before the
    lease can expire: it starts when only its timeout is left, so that timeout must fit
    between two renewals, as kill_grace must (its default, 5s, shrinks alike)."""
    rooms = {name: t.lease_window - t.renew_interval for name, t in timings.items()}
    given = settings.get("hook_timeout")
    timeout = min([5.0] + [round(r * 0.6, 3) for r in rooms.values()])
    if given is not None:
        timeout = _positive("hook_timeout", given)
    gates = _flag("elected_hook_gates", settings.get("elected_hook_gates", False))
    hooks = parse_hooks(dict(settings), timeout, gates)
    for name, room in rooms.items() if hooks.on_demoted else ():
        if not hooks.timeout < room:
            raise ValueError(
                f"election {name}: hook_timeout ({hooks.timeout:g}s) must be less than "
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
