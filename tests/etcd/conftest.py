"""etcd tests: the shared 3-member cluster (tests/etcd/fixtures.py)."""

from tests.etcd.fixtures import etcd, etcd_cluster

__all__ = ["etcd", "etcd_cluster"]
