"""etcd tests: the shared 3-member cluster (tests/support/etcd_fixtures.py), and backends that a
test opens and that are closed after it."""

from collections.abc import AsyncIterator

import pytest

from leaderd.backends import Backend
from tests.support.etcd_fixtures import etcd, etcd_cluster

__all__ = ["etcd", "etcd_cluster"]


@pytest.fixture
async def opened() -> AsyncIterator[list[Backend]]:
    """Append each backend a test opens: it is closed after the test."""
    backends: list[Backend] = []
    yield backends
    for backend in backends:
        await backend.close()
