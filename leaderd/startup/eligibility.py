"""Who may lead, as configured: the health checks an election leads under, this node's
priority in it, and what a leader does when its checks fail (docs/operations.md, "Health checks";
docs/algorithm.md, "Who leads").

Settings, each for all elections (flags, LEADERD_* variables, the file's top level) and per
election (``[elections.NAME]``, which beats the file's top level, never a flag or variable):

- ``check``: checks (checks.py), a target or a table ``{target = ..., interval = ...}``;
  an election's own checks are added to those for all;
- ``check_interval``, ``check_timeout``, ``check_failures``, ``check_successes``,
  ``check_grace``: the timing of checks that do not give their own;
- ``priority``: 1 by default; a standby of higher priority is chosen first; 0 never leads
  (a witness, still listed among the members);
- ``on_unhealthy``: handover (the default), step-down or keep;
- ``failback``: seconds a healthy standby of higher priority must be seen before the leader
  hands over to it (off by default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..supervision.checks import CheckError, CheckSpec

ON_UNHEALTHY = ("handover", "step-down", "keep")
# Setting -> the CheckSpec field it sets by default.
_CHECK_TIMING = {f"check_{f.name}": f.name for f in fields(CheckSpec) if f.name != "target"}
ELECTION_KEYS = ("check", "priority", "on_unhealthy", "failback", *_CHECK_TIMING)
ENV = {key: f"LEADERD_{key.upper()}" for key in ELECTION_KEYS if key != "check"}
MAX_PRIORITY = 1_000_000


class EligibilityError(ValueError):
    """One line naming the setting and the rule (config.py makes it a ConfigError)."""


@dataclass(frozen=True, slots=True)
class Eligibility:
    """Who may lead one election, as far as this node is concerned."""

    checks: tuple[CheckSpec, ...] = ()
    priority: int = 1
    on_unhealthy: str = "handover"
    failback: float | None = None  # seconds; None: off

    @property
    def witness(self) -> bool:
        """Priority 0: listed among the members, never leads."""
        return self.priority == 0


def eligibility(
    name: str, top: Mapping[str, Any], own: Mapping[str, Any], given: Mapping[str, Any]
) -> Eligibility:
    """The eligibility of election ``name`` from the file's top level (``top``), its
    ``[elections.NAME]`` table (``own``) and the flags over the environment (``given``)."""
    layered = {**top, **own, **given}
    timing = {field: layered[key] for key, field in _CHECK_TIMING.items() if key in layered}
    for_all = given.get("check") or top.get("check")
    targets = [*_listed(for_all), *_listed(own.get("check"))]
    try:
        checks = tuple(_check(target, timing) for target in targets)
    except CheckError as exc:
        raise EligibilityError(f"election {name}: {exc}") from None
    return Eligibility(
        checks=tuple(dict.fromkeys(checks)),
        priority=_priority(name, layered.get("priority", 1)),
        on_unhealthy=_on_unhealthy(name, layered.get("on_unhealthy", "handover")),
        failback=_failback(name, layered.get("failback")),
    )


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _check(item: Any, timing: Mapping[str, Any]) -> CheckSpec:
    """A check from a target (with the default timing) or a table of its own."""
    own = dict(item) if isinstance(item, Mapping) else {"target": item}
    unknown = sorted(set(own) - {"target", *_CHECK_TIMING.values()})
    if unknown:
        raise CheckError(f"check {own.get('target')!r}: unknown setting {unknown[0]!r}")
    values = {**timing, **own}
    target = str(values.pop("target", ""))
    try:
        seconds = {k: float(v) for k, v in values.items() if k in ("interval", "timeout", "grace")}
        counts = {k: _whole(k, v) for k, v in values.items() if k in ("failures", "successes")}
    except (TypeError, ValueError) as exc:
        raise CheckError(f"check {target!r}: {exc}") from None
    spec = CheckSpec(target, seconds.get("interval", 5.0), seconds.get("timeout", 2.0),
                     counts.get("failures", 3), counts.get("successes", 1),
                     seconds.get("grace", 0.0))  # fmt: skip
    spec.validate()
    return spec


def _whole(key: str, value: Any) -> int:
    if isinstance(value, bool) or not str(value).isdigit():
        raise CheckError(f"{key} must be a whole number >= 1 (got {value!r})")
    return int(str(value))


def _priority(name: str, value: Any) -> int:
    text = str(value)
    if isinstance(value, bool) or not text.isdigit() or int(text) > MAX_PRIORITY:
        rule = f"a whole number from 0 (never leads) to {MAX_PRIORITY}"
        raise EligibilityError(f"election {name}: priority must be {rule} (got {value!r})")
    return int(text)


def _on_unhealthy(name: str, value: Any) -> str:
    if value not in ON_UNHEALTHY:
        allowed = ", ".join(ON_UNHEALTHY)
        raise EligibilityError(f"election {name}: on_unhealthy must be one of {allowed} "
                               f"(got {value!r})")  # fmt: skip
    return str(value)


def _failback(name: str, value: Any) -> float | None:
    if value is None:
        return None
    try:
        delay = float(value)
    except (TypeError, ValueError):
        delay = -1.0
    if not 0 <= delay < float("inf"):
        raise EligibilityError(f"election {name}: failback must be a number of seconds >= 0 "
                               f"(got {value!r})")  # fmt: skip
    return delay
