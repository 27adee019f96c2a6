"""The configuration file's schema (config.schema.json) and the one-line message for a breach.

The whole TOML document is checked against one declared JSON Schema before any setting is
read, so no malformed file can reach the loader's code (``elections = 5`` is a message, not
a traceback). JSON Schema because Debian 12 packages python3-jsonschema (msgspec is not in
bookworm), and because editors that check TOML against a JSON Schema (taplo, Even Better
TOML) can use the same file.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from typing import Any

from .. import package_files

_SIMPLE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


@functools.cache
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(package_files.read_bytes("config.schema.json"))
    return loaded


def breach(document: dict[str, Any]) -> str | None:
    """None if ``document`` fits the schema, else one line naming the key and the rule."""
    import jsonschema  # ~0.1s to import: only the daemon and check-config pay for it

    validator = jsonschema.Draft202012Validator(schema())
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    except RecursionError:
        return "values nested too deeply"
    if error is None:
        return None
    path = list(error.absolute_path)
    if error.validator == "additionalProperties":
        known = _walk(path)[0].get("properties", {})
        unknown = sorted(str(k) for k in error.instance if k not in known)
        return f"unknown setting {unknown[0]!r}{_where(path)}"
    if "propertyNames" in error.relative_schema_path:
        rule = schema()["properties"]["elections"]["propertyNames"]["description"]
        return f"election name {error.instance!r} must be {rule}"
    return f"{_where(path, ' ')}{_key(path[-1]) if path else 'the file'} must be " + (
        f"{_walk(path)[1]} (got {_shown(error.instance)})"
    )


def _walk(path: Iterable[Any]) -> tuple[dict[str, Any], str]:
    """The schema of the value at ``path`` ($ref resolved) and how its description reads."""
    node, description = schema(), "valid"
    for part in path:
        properties = node.get("properties", {})
        child = properties[part] if part in properties else node.get("additionalProperties")
        child = node["items"] if isinstance(part, int) and "items" in node else child
        child = child if isinstance(child, dict) else {}
        node = _resolve(child)
        description = child.get("description") or node.get("description") or "valid"
    return node, str(description)


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return node
    resolved: dict[str, Any] = schema()["$defs"][ref.rsplit("/", 1)[-1]]
    return resolved


def _where(path: list[Any], suffix: str = "") -> str:
    """The TOML table holding the last key of ``path``, e.g. ' in [elections.jobs]'."""
    tables = [_key(p) for p in path[:-1]] if suffix else [_key(p) for p in path]
    if not tables:
        return ""
    table = "[" + ".".join(tables) + "]"
    return f"{table}{suffix}" if suffix else f" in {table}"


def _key(part: Any) -> str:
    text = str(part)
    return text if _SIMPLE_KEY.match(text) else repr(text)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
