"""pytest plugin: a throwaway PostgreSQL server for the whole test session.

``pg_server`` starts it once (and fails, never skips, when it cannot start); ``pg`` is
the same server for one test that may stop, kill or restart it: it is running again
before and after the test. ``fake_time_server`` is one per test module whose wall clock
the tests step (libfaketime).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.pgserver import FakeTimeServer, PgServer


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    server = PgServer()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def pg(pg_server: PgServer) -> Iterator[PgServer]:
    pg_server.ensure_running()
    try:
        yield pg_server
    finally:
        pg_server.ensure_running()


@pytest.fixture(scope="module")
def fake_time_server() -> Iterator[FakeTimeServer]:
    server = FakeTimeServer()
    try:
        yield server
    finally:
        server.cleanup()
