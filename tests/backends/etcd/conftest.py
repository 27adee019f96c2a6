"""etcd tests: the shared 3-member cluster (tests/support/etcd_fixtures.py), the backends a
test opens (closed after it), and a gateway proxy in front of the first member."""

from collections.abc import AsyncIterator, Iterator

import pytest

from leaderd.backends import Backend
from tests.backends.etcd.gateway_proxy import GatewayProxy
from tests.support.etcd_cluster import EtcdCluster
from tests.support.etcd_fixtures import etcd, etcd_cluster

__all__ = ["etcd", "etcd_cluster"]


@pytest.fixture
async def opened() -> AsyncIterator[list[Backend]]:
    """Append each backend a test opens: it is closed after the test."""
    backends: list[Backend] = []
    yield backends
    for backend in backends:
        await backend.close()


@pytest.fixture
def proxy(etcd: EtcdCluster) -> Iterator[GatewayProxy]:
    """A gateway proxy (gateway_proxy.py) in front of the first member."""
    host, port = etcd.members[0].hostport.rsplit(":", 1)
    proxy = GatewayProxy(host, int(port)).start()
    yield proxy
    proxy.close()
