"""When a `run --once-per` job is due (once_per.due_in): a table of cases on the backend's
clock, which the record carries."""

from __future__ import annotations

import pytest

from leaderd.backends.jobs import JobRecord
from leaderd.supervision.once_per import due_in

P = 60.0  # the period
START = 1_000_000.0  # the last recorded start

CASES = [
    # (what, seconds since the last start (None: never started), catch_up, due in)
    ("never started: due at once", None, False, 0.0),
    ("just started: a whole period to go", 0.0, False, P),
    ("mid-period (a failover): the rest of the period", 25.0, False, P - 25.0),
    ("exactly one period later: due", P, False, 0.0),
    ("late by less than a period (a failover at the due time): at once", P + 10.0, False, 0.0),
    ("an outage missed a whole period: the schedule's next point", 2 * P + 10.0, False, P - 10.0),
    ("an outage of several periods: the next point", 5 * P + 59.0, False, 1.0),
    ("with --catch-up: at once after a missed period", 2 * P + 10.0, True, 0.0),
    ("with --catch-up: at once after many", 9 * P, True, 0.0),
    ("with --catch-up, mid-period: still the rest of the period", 25.0, True, P - 25.0),
]


@pytest.mark.parametrize(("since", "catch_up", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_due_in(since: float | None, catch_up: bool, expected: float) -> None:
    if since is None:
        record = JobRecord("default", now=START)
    else:
        record = JobRecord("default", now=START + since, runs=1, started_at=START)
    assert due_in(record, P, catch_up) == pytest.approx(expected)
