"""The Kubernetes control plane fixture, shared by tests/backends/kubernetes, the backend
contract suite and the job stores: one real control plane (tests/support/kube_cluster.py) for
the session.

It fails, never skips, when it cannot be built or started: CI builds it in .ci/install-deps.sh.
"""

from collections.abc import Iterator

import pytest

from tests.support.kube_cluster import ControlPlane


@pytest.fixture(scope="session")
def kube() -> Iterator[ControlPlane]:
    control_plane = ControlPlane()
    try:
        yield control_plane
    finally:
        control_plane.cleanup()
