"""What config.py and election_table.py share: the error every bad setting becomes, and
the reading of a number of seconds."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """Bad configuration; the message is one line naming the setting and the rule."""


def seconds(key: str, value: Any) -> float:
    """``value`` of setting ``key`` as a finite number of seconds >= 0."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be a number of seconds (got {value!r})") from None
    if number != number or number < 0 or number == float("inf"):
        raise ConfigError(f"{key} must be a finite number >= 0 (got {value!r})")
    return number
