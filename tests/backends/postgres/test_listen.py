"""The LISTEN connection: an outage is a few log lines, not one per reconnect attempt."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from leaderd.backends.postgres.lease import PostgresLeaseBackend
from leaderd.backends.postgres.listen import Outage
from tests.backends.postgres.helpers import opened, unique, until
from tests.support.pgserver import PgServer

LOGGER = "leaderd.backends.postgresql"


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


@pytest.mark.postgres
async def test_a_database_outage_logs_its_start_and_its_end(
    pg: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    u, e = pg.dsn(table=unique("t")), unique()
    async with opened(u, e) as b:
        assert isinstance(b, PostgresLeaseBackend) and b.listening
        await asyncio.to_thread(pg.stop)
        await asyncio.sleep(4)  # reconnect attempts 0.1, 0.2, 0.4, ... 1.6 s apart: five or more
        await asyncio.to_thread(pg.start)
        assert await until(lambda: b.listening, 10)
    warnings = lines(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings
    assert "the connection was lost; standbys poll until it is back" in warnings[0]
    (back,) = [m for m in lines(caplog, logging.INFO) if "back after" in m]
    found = re.search(r"and (\d+) failed attempts", back)
    assert found and int(found.group(1)) >= 5, back


def test_an_hour_of_retries_is_thirteen_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    now = [0.0]
    outage = Outage("LISTEN leaderd_leaderd_lease", clock=lambda: now[0])
    for attempt in range(1400):  # one attempt every 2.5 s, about the hour
        now[0] = attempt * 2.5
        outage.failed("connection refused")
    now[0] = 3500.0
    outage.ended()
    warnings = lines(caplog, logging.WARNING)
    assert len(warnings) == 1 + 11, warnings  # the start, then one summary per 5 minutes
    assert warnings[0].endswith("connection refused; standbys poll until it is back")
    assert warnings[1].endswith(
        "still down after 300s, 121 failed attempts; last: connection refused"
    )
    (end,) = lines(caplog, logging.INFO)
    assert end.startswith("LISTEN leaderd_leaderd_lease: back after 3500.0s and 1400 failed")
    assert not outage.ongoing
