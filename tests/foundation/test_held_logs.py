"""Log lines held while a hand-over's writes leave (leaderd/held_logs.py): none is lost,
each keeps the order, time and place it was logged, and a hold ends by itself."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from leaderd import held_logs

log = logging.getLogger("leaderd.test")


class Written(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == log.name:  # not asyncio's own lines
            self.records.append(record)

    @property
    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture
def written() -> Iterator[Written]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    handler = Written()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG)
    yield handler
    held_logs.release()
    root.handlers[:], root.level = handlers, level


async def test_kept_lines_and_everyone_elses_are_written_in_the_order_they_were_logged(
    written: Written,
) -> None:
    held_logs.hold()
    held_logs.log(log, logging.INFO, "received %s: handing over", "SIGTERM")
    log.warning("the child stopped")  # a line logged the ordinary way meanwhile
    held_logs.log(log, logging.INFO, "stepping down")
    assert written.records == []
    held_logs.release()
    assert written.messages == ["received SIGTERM: handing over", "the child stopped",
                                "stepping down"]  # fmt: skip
    log.info("released")
    assert written.messages[-1] == "released"


async def test_a_kept_line_has_the_time_and_place_it_was_logged_not_written(
    written: Written,
) -> None:
    held_logs.hold()
    before, line = time.time(), sys._getframe().f_lineno + 1
    held_logs.log(log, logging.INFO, "stepping down", extra={"term": 7})
    await asyncio.sleep(0.02)
    written_after = time.time()
    held_logs.release()
    (record,) = written.records
    assert before <= record.created < written_after - 0.01
    assert record.msecs == pytest.approx((record.created % 1) * 1000)
    assert record.pathname == __file__ and record.funcName == (
        "test_a_kept_line_has_the_time_and_place_it_was_logged_not_written"
    )
    assert record.lineno == line and record.term == 7  # type: ignore[attr-defined]


async def test_a_hold_nobody_releases_ends_by_itself(written: Written) -> None:
    held_logs.hold()
    held_logs.log(log, logging.INFO, "received SIGTERM: handing over")
    for _ in range(500):  # 5 s at most: the hold's own bound is 50 ms
        if written.records:
            break
        await asyncio.sleep(0.01)
    assert written.messages == ["received SIGTERM: handing over"]
    assert not held_logs.holding()


def test_without_a_running_loop_nothing_is_held(written: Written) -> None:
    held_logs.hold()  # nothing could release it
    held_logs.log(log, logging.INFO, "exiting")
    assert written.messages == ["exiting"]


async def test_a_level_that_is_off_keeps_nothing(written: Written) -> None:
    held_logs.hold()
    held_logs.log(log, logging.DEBUG - 1, "noise")
    held_logs.release()
    assert written.records == []


def test_a_change_published_before_the_loop_runs_is_logged_at_once(written: Written) -> None:
    held_logs.hold()  # what answers.py does on every change; nothing holds without a loop
    held_logs.log(log, logging.DEBUG, "election default has no leader")
    held_logs.release_soon()
    assert written.messages == ["election default has no leader"]


async def test_another_threads_line_is_written_at_once(written: Written) -> None:
    held_logs.hold()
    held_logs.log(log, logging.INFO, "stepping down")
    thread = threading.Thread(target=log.warning, args=("from a driver's thread",))
    thread.start()
    thread.join()
    assert written.messages == ["from a driver's thread"]
    held_logs.release()
    assert written.messages == ["from a driver's thread", "stepping down"]
