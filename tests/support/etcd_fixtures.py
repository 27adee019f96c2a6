"""The etcd cluster fixtures, shared by tests/backends/etcd and the backend contract suite.

``etcd_cluster`` is one 3-member cluster for the whole session (it fails, never skips, when
etcd cannot start: CI installs it); both conftest files that import it get the same one.
``etcd`` is that cluster for one test that may stop, kill or pause members: every member is
running again before and after the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.etcd_cluster import EtcdCluster

_shared: list[EtcdCluster] = []
_users = [0]


@pytest.fixture(scope="session")
def etcd_cluster() -> Iterator[EtcdCluster]:
    if not _shared:
        _shared.append(EtcdCluster(3))
    _users[0] += 1
    try:
        yield _shared[0]
    finally:
        _users[0] -= 1
        if not _users[0]:
            _shared.pop().cleanup()


@pytest.fixture
def etcd(etcd_cluster: EtcdCluster) -> Iterator[EtcdCluster]:
    etcd_cluster.ensure_running()
    try:
        yield etcd_cluster
    finally:
        etcd_cluster.ensure_running()
