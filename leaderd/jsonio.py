"""JSON in and out: orjson when installed (fast), else the standard library.

Debian 12 packages no orjson, and a packaged daemon must still run there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - exercised by the Debian package test
    orjson = None  # type: ignore[assignment]


def dumps(
    value: Any, *, indent: bool = False, default: Callable[[Any], Any] | None = None
) -> bytes:
    """Compact JSON as bytes (two-space indented when asked)."""
    if orjson is not None:
        return orjson.dumps(value, default=default, option=orjson.OPT_INDENT_2 if indent else 0)
    text = json.dumps(value, default=default, indent=2 if indent else None,
                      separators=None if indent else (",", ":"), ensure_ascii=False)  # fmt: skip
    return text.encode()


def loads(data: bytes | str) -> Any:
    return orjson.loads(data) if orjson is not None else json.loads(data)
