"""The API's query parameters: parsed strictly, refused with one clear sentence (400)."""

from __future__ import annotations

import math
import re

MAX_REVISION = 2**63 - 1
_TRUE = ("1", "true", "ndjson", "sse")
_FALSE = ("0", "false")
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_INTEGER = re.compile(r"-?[0-9]+")


class BadParameter(ValueError):
    """A query parameter that cannot be used; answered with 400."""


def revision(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not _INTEGER.fullmatch(raw) or not 0 <= int(raw) <= MAX_REVISION:
        raise BadParameter(f"revision must be an integer in [0, {MAX_REVISION}], got {raw!r}")
    return int(raw)


def seconds(raw: str | None, name: str, default: float, maximum: float) -> float:
    if raw is None:
        return default
    value = float(raw) if _NUMBER.fullmatch(raw) else math.nan
    if not 0 <= value <= maximum:  # also rejects nan and inf
        raise BadParameter(f"{name} must be a number of seconds in [0, {maximum:g}], got {raw!r}")
    return value


def flag(raw: str | None, name: str) -> bool:
    if raw is None:
        return False
    if raw not in _TRUE and raw not in _FALSE:
        raise BadParameter(f"{name} must be one of 1, true, ndjson, sse, 0, false; got {raw!r}")
    return raw in _TRUE


def count(raw: str | None, name: str, default: int, maximum: int) -> int:
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw) or not 1 <= int(raw) <= maximum:
        raise BadParameter(f"{name} must be an integer in [1, {maximum}], got {raw!r}")
    return int(raw)
