"""The configuration loader against generated TOML: any document, valid or not, gives a
Config or one ConfigError line; never another exception (a traceback and exit 1)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leaderd.startup import schema
from leaderd.startup.config import ConfigError, load

TOP = sorted(schema.schema()["properties"])
TIMING = sorted(schema.schema()["$defs"]["timing"]["properties"])
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["0660", "0.0.0.0:4040", "static://", "json", "info", "restart", "a b"]),
    st.datetimes(timezones=st.none() | st.just(dt.UTC)),
    st.dates(),
)
keys = st.one_of(st.sampled_from(TOP + TIMING + ["default", "jobs"]), st.text(max_size=8))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)
timing_tables = st.dictionaries(st.sampled_from(TIMING) | keys, values, max_size=4)
documents = st.fixed_dictionaries(
    {},
    optional={
        **{key: values for key in TOP},
        "defaults": timing_tables | values,
        "elections": st.dictionaries(keys, timing_tables | values, max_size=3) | values,
    },
)


def dump_value(value: Any) -> str:
    """TOML for a value: inline tables and arrays, so any nesting fits on one line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, str):
        return dump_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(dump_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{dump_string(k)} = {dump_value(v)}" for k, v in value.items()) + "}"


def dump_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def dump(document: dict[str, Any]) -> str:
    return "".join(f"{dump_string(k)} = {dump_value(v)}\n" for k, v in document.items())


def load_text(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.toml"
    path.write_bytes(data)
    try:
        load({}, {"HOSTNAME": "h"}, file=str(path))
    except ConfigError as exc:
        message = str(exc)
        assert message and "\n" not in message and "Traceback" not in message, message


@FUZZ
@given(document=documents)
def test_generated_documents_load_or_fail_in_one_line(
    tmp_path_factory: pytest.TempPathFactory, document: dict[str, Any]
) -> None:
    load_text(tmp_path_factory.mktemp("fuzz"), dump(document).encode())


@FUZZ
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_arbitrary_bytes_load_or_fail_in_one_line(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    load_text(tmp_path_factory.mktemp("fuzz"), data)


@FUZZ
@given(key=st.sampled_from(TOP), value=st.sampled_from([[1], {"x": 1}, dt.date(2026, 1, 1)]))
def test_a_value_of_the_wrong_kind_is_named_by_its_key(
    tmp_path_factory: pytest.TempPathFactory, key: str, value: Any
) -> None:
    """No top-level setting takes an array, an inline table or a date (except the two
    tables, which take no array or date, and the list of checks, whose items are named)."""
    if key in ("defaults", "elections") and isinstance(value, dict):
        value = [1]
    path = tmp_path_factory.mktemp("fuzz") / "leaderd.toml"
    path.write_text(dump({key: value}))
    with pytest.raises(ConfigError) as err:
        load({}, {"HOSTNAME": "h"}, file=str(path))
    named = f"[{key}] 0 must be" if key == "check" and isinstance(value, list) else f"{key} must be"
    assert named in str(err.value), str(err.value)
