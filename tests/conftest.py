"""Shared test set-up: the PostgreSQL server plugin, and no daemon outliving its test."""

from collections.abc import Iterator

import pytest

from tests.daemons import Daemon

pytest_plugins = ["tests.pg_fixtures"]


@pytest.fixture(autouse=True)
def no_daemon_left_behind() -> Iterator[None]:
    """A test that fails half-way must not leave its daemons running."""
    yield
    while Daemon.started:
        Daemon.started.pop().kill()
