"""Kubernetes tests: one real control plane (tests/backends/kubernetes/cluster.py) for the session.

It fails, never skips, when it cannot be built or started: CI builds it in .ci/install-deps.sh.
"""

import shutil
from collections.abc import Iterator

import pytest

from tests.backends.kubernetes.cluster import ControlPlane
from tests.backends.kubernetes.electors import Elector
from tests.support.daemons import short_tempdir


@pytest.fixture(scope="session")
def kube() -> Iterator[ControlPlane]:
    control_plane = ControlPlane()
    try:
        yield control_plane
    finally:
        control_plane.cleanup()


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
