"""The etcd backend: a leader key bound to an etcd lease, over the v3 JSON gateway
(docs/etcd.md)."""
