"""Kubernetes tests: one real control plane for the session (tests/support/kube_fixtures.py),
the client-go electors a test starts, and a short directory for the daemons' sockets."""

import shutil
from collections.abc import Iterator

import pytest

from tests.support.daemons import short_tempdir
from tests.support.kube_electors import Elector
from tests.support.kube_fixtures import kube

__all__ = ["kube"]


@pytest.fixture
def electors() -> Iterator[list[Elector]]:
    """The client-go electors a test started, killed after it if still running."""
    started: list[Elector] = []
    yield started
    for elector in started:
        elector.stop()


@pytest.fixture
def workdir() -> Iterator[str]:
    """A short directory for the daemons' sockets (Unix socket paths stay under 108 bytes)."""
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)
