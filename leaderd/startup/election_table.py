"""The elections a daemon contests and each one's own settings (docs/configuration.md):
their names from the flags, LEADERD_ELECTIONS or the file's ``[elections.NAME]`` tables;
per election its timing, who may lead (eligibility.py) and its transition hooks
(hook_settings.py).

An ``[elections.NAME]`` table beats the file's top level (``[defaults]`` for timing); flags
and environment variables beat the file, even its per-election values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..election.timing import Timing, TimingError
from ..supervision.hooks import Hooks
from .config_values import ConfigError, seconds
from .eligibility import ELECTION_KEYS, Eligibility, EligibilityError, eligibility
from .hook_settings import HOOK_KEYS, hooks_of

TIMING_KEYS = tuple(f.name for f in fields(Timing))
_ELECTION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True, slots=True)
class ElectionConfig:
    name: str
    timing: Timing
    # Who may lead: health checks, priority, on_unhealthy (eligibility.py).
    eligibility: Eligibility = field(default_factory=Eligibility)
    # --on-elected/--on-demoted/--on-stop and their bound, for this election (hooks.py).
    hooks: Hooks = field(default_factory=Hooks)


def elections(
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    toml: Mapping[str, Any],
    settings: Mapping[str, Any],
    given: Mapping[str, Any],
) -> tuple[ElectionConfig, ...]:
    """Each election's settings from the ``flags``, the environment (``env``), the ``toml``
    document, the merged top-level ``settings`` and those ``given`` by flags or variables."""
    table = toml.get("elections", {})
    names: list[str] = list(flags.get("elections") or [])
    if not names and env.get("LEADERD_ELECTIONS"):
        names = [n.strip() for n in env["LEADERD_ELECTIONS"].split(",") if n.strip()]
    names = names or list(table) or ["default"]
    if len(set(names)) != len(names):
        raise ConfigError(f"election named twice in {names}")
    base = {**toml.get("defaults", {})}
    result = []
    for name in names:
        if not _ELECTION_NAME.match(name):
            raise ConfigError(
                f"election name {name!r} must be 1-128 letters, digits, '.', '_' or '-'"
            )
        own = table.get(name, {})
        # flags and env beat the file, even the file's per-election values
        layered = {
            **base,
            **{k: v for k, v in own.items() if k not in (*ELECTION_KEYS, *HOOK_KEYS)},
            **{k: settings[k] for k in TIMING_KEYS if k in settings},
        }
        timing = _timing(name, layered)
        eligible = _eligible(name, toml, own, given)
        result.append(
            ElectionConfig(name, timing, eligible, _hooks(name, timing, toml, own, given))
        )
    return tuple(result)


def _picked(values: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if k in keys}


def _eligible(
    name: str, toml: Mapping[str, Any], own: Mapping[str, Any], given: Mapping[str, Any]
) -> Eligibility:
    try:
        return eligibility(name, *(_picked(v, ELECTION_KEYS) for v in (toml, own, given)))
    except EligibilityError as exc:
        raise ConfigError(str(exc)) from None


def _hooks(
    name: str,
    timing: Timing,
    toml: Mapping[str, Any],
    own: Mapping[str, Any],
    given: Mapping[str, Any],
) -> Hooks:
    layered = {k: v for values in (toml, own, given) for k, v in _picked(values, HOOK_KEYS).items()}
    try:
        return hooks_of(name, layered, timing)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _timing(name: str, raw: Mapping[str, Any]) -> Timing:
    unknown = sorted(set(raw) - set(TIMING_KEYS))
    if unknown:
        raise ConfigError(f"election {name}: unknown setting {unknown[0]!r}")
    timing = Timing(**{key: seconds(key, value) for key, value in raw.items()})
    try:
        timing.validate(name)
    except TimingError as exc:
        raise ConfigError(str(exc)) from None
    return timing
