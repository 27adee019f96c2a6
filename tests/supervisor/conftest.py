"""The ``cluster`` fixture: a work directory, its daemons, and nothing left behind."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.support.daemons import short_tempdir
from tests.support.supervision.cluster import Cluster
from tests.support.supervision.confine import cgroup_root
from tests.support.supervision.records import kill_leftovers


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """Daemons as this host runs them (here: a PID namespace for each command)."""
    yield from _cluster("pidns")


@pytest.fixture(params=["pidns", "cgroup", "session"])
def contained(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The same, once for each containment leaderd can find on a host."""
    if request.param == "cgroup" and (os.geteuid() != 0 or cgroup_root() is None):
        pytest.skip("a test cgroup needs root and a writable cgroup v2 hierarchy")
    yield from _cluster(request.param)


def _cluster(containment: str) -> Iterator[Cluster]:
    workdir = short_tempdir("ld-sv-")
    cluster = Cluster(workdir, containment)
    try:
        yield cluster
    finally:
        kill_leftovers(workdir)
        cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)
