"""The API's query parameters: parsed strictly, refused with one clear sentence (400)."""

from __future__ import annotations

import math
import re

MAX_REVISION = 2**63 - 1
_TRUE = ("1", "true", "ndjson", "sse")
_FALSE = ("0", "false")
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_INTEGER = re.compile(r"-?[0-9]+")


NODE_ID_RULE = "1-253 characters without spaces or control characters"
# The same rule as the OpenAPI document's pattern, which tools read in their own regex dialect.
_NODE_ID = re.compile(r"[^\s\x00-\x1f\x7f-\x9f]{1,253}")


def is_node_id(value: str) -> bool:
    """A node id as --node-id accepts it."""
    return _NODE_ID.fullmatch(value) is not None and not any(c.isspace() for c in value)


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


def node_id(raw: str | None, name: str) -> str:
    """A node id naming another daemon; "" when the parameter is absent."""
    if raw is None:
        return ""
    if not is_node_id(raw):
        raise BadParameter(f"{name} must be a node id ({NODE_ID_RULE}), got {raw!r}")
    return raw
