"""Log set-up: the journal when systemd connected stderr to it, plain stderr otherwise.

The real journal is checked in tests/deploy/test_systemd_boot.py; here a recording
stand-in for systemd-python's journal.send shows which fields each entry carries.
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leaderd.startup import logs


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Installs a stand-in systemd.journal module whose send() records its calls."""
    calls: list[tuple[str, dict[str, Any]]] = []
    journal = types.ModuleType("systemd.journal")
    journal.send = lambda message, **fields: calls.append((message, fields))  # type: ignore[attr-defined]
    package = types.ModuleType("systemd")
    package.journal = journal  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "systemd", package)
    monkeypatch.setitem(sys.modules, "systemd.journal", journal)
    return calls


@pytest.fixture
def journal_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[io.TextIOWrapper]:
    """stderr as systemd sets it up: JOURNAL_STREAM names the stream's device and inode."""
    with open(tmp_path / "stderr", "w") as stream:
        stat = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino}")
        yield stream


def decision() -> logging.LogRecord:
    sentence = "acquired election %s, term %d"
    record = logging.LogRecord(
        "leaderd.engine", logging.INFO, "/x/engine.py", 7, sentence, ("scheduler", 42), None
    )
    extra = {"event": "leader", "election": "scheduler", "term": 42, "holder": "node-a",
             "reason": None}  # fmt: skip
    record.__dict__.update(extra)
    return record


def test_journal_entry_carries_each_extra_field_as_leaderd_field() -> None:
    fields = logs.journal_fields(decision())
    assert fields["LEADERD_EVENT"] == "leader"
    assert fields["LEADERD_ELECTION"] == "scheduler"
    assert fields["LEADERD_TERM"] == "42"
    assert fields["LEADERD_HOLDER"] == "node-a"
    assert "LEADERD_REASON" not in fields, "a field without a value is left out"
    assert fields["PRIORITY"] == "6" and fields["SYSLOG_IDENTIFIER"] == "leaderd"
    assert (fields["CODE_FILE"], fields["CODE_LINE"]) == ("/x/engine.py", 7)


@pytest.mark.parametrize(
    ("level", "priority"),
    [(logging.DEBUG, "7"), (logging.INFO, "6"), (logging.WARNING, "4"), (logging.ERROR, "3"),
     (logging.CRITICAL, "2")],
)  # fmt: skip
def test_journal_priority_follows_the_level(level: int, priority: str) -> None:
    record = logging.LogRecord("leaderd", level, "f.py", 1, "m", (), None)
    assert logs.journal_fields(record)["PRIORITY"] == priority


def test_under_systemd_decisions_go_to_the_journal(
    sent: list[tuple[str, dict[str, Any]]], journal_stderr: io.TextIOWrapper
) -> None:
    logs.setup("text", "info", journal_stderr)
    logging.getLogger("leaderd.engine").info(
        "stepping down from election %s, term %d: %s", "default", 3, "resigned",
        extra={"event": "follower", "election": "default", "term": 3, "holder": None,
               "reason": "resigned"},
    )  # fmt: skip
    message, fields = sent[-1]
    assert message == "stepping down from election default, term 3: resigned"
    assert fields["LEADERD_ELECTION"] == "default" and fields["LEADERD_TERM"] == "3"
    assert fields["LEADERD_REASON"] == "resigned" and "LEADERD_HOLDER" not in fields
    journal_stderr.flush()
    assert Path(journal_stderr.name).read_text() == "", "nothing doubled on stderr"


def test_stderr_that_is_not_the_journal_stays_plain(
    sent: list[tuple[str, dict[str, Any]]], journal_stderr: io.TextIOWrapper,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # Another stream than the one JOURNAL_STREAM names: a child's redirected stderr.
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")
    logs.setup("json", "info", journal_stderr)
    logging.getLogger("leaderd").info("released election default, term 3",
                                      extra={"event": "released", "term": 3})  # fmt: skip
    journal_stderr.flush()
    line = json.loads(Path(journal_stderr.name).read_text())
    assert line["message"] == "released election default, term 3"
    assert (line["event"], line["term"]) == ("released", 3)
    assert sent == []


def test_without_systemd_python_the_journal_stream_gets_text(
    journal_stderr: io.TextIOWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "systemd", None)  # import fails as if not installed
    logs.setup("text", "info", journal_stderr)
    logging.getLogger("leaderd").info("acquired election default, term 1")
    journal_stderr.flush()
    text = Path(journal_stderr.name).read_text()
    assert text.endswith("INFO    acquired election default, term 1\n"), text


def test_json_lines_carry_every_extra_field() -> None:
    formatter = logs.JsonFormatter()
    record = decision()
    record.__dict__["pid"] = 1234
    line = json.loads(formatter.format(record))
    assert line["message"] == "acquired election scheduler, term 42"
    assert {k: line[k] for k in ("event", "election", "term", "holder", "pid")} == {
        "event": "leader", "election": "scheduler", "term": 42, "holder": "node-a", "pid": 1234,
    }  # fmt: skip
    assert "reason" not in line
