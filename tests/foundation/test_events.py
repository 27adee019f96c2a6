"""The log-event schema (leaderd/events.py): every event the code can emit is declared
once, and each formatter carries every one of its fields."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from leaderd.events import FIELDS, Event, extra
from leaderd.startup import logs

LEADERD = Path(__file__).resolve().parents[2] / "leaderd"


def record(event: Event) -> logging.LogRecord:
    fields = {name: f"value-of-{name}" for name in FIELDS[event]}
    entry = logging.LogRecord("leaderd", logging.INFO, __file__, 1, "a sentence", (), None)
    entry.__dict__.update(extra(event, **fields))
    return entry


@pytest.mark.parametrize("event", list(Event))
def test_json_and_the_journal_carry_every_field_of_every_event(event: Event) -> None:
    entry = record(event)
    as_json = json.loads(logs.JsonFormatter().format(entry))
    journal = logs.journal_fields(entry)
    assert as_json["event"] == journal["LEADERD_EVENT"] == event.value
    for name in FIELDS[event]:
        assert as_json[name] == f"value-of-{name}", name
        assert journal[f"LEADERD_{name.upper()}"] == f"value-of-{name}", name
    assert "a sentence" in logs.TextFormatter().format(entry)


def test_an_undeclared_field_is_refused() -> None:
    with pytest.raises(ValueError, match="has no field"):
        extra(Event.RELEASED, pid=1)


def test_every_log_call_goes_through_the_schema() -> None:
    """No module spells an event by hand: each uses extra(Event.X, ...)."""
    for path in LEADERD.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"""["']event["']\s*:""", text) or path.name == "events.py", path


def test_every_declared_event_is_emitted_somewhere() -> None:
    source = "\n".join(p.read_text() for p in LEADERD.rglob("*.py") if p.name != "events.py")
    roles = {"leader", "follower", "unknown", "stopped"}  # emitted as Event(view.role.value)
    unused = [e for e in Event if e.value not in roles and f"Event.{e.name}" not in source]
    assert not unused
