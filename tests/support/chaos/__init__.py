"""The chaos harness's parts: real leaderd daemons under injected faults (harness.py), the
fault proxy and the wire protocols it reads, the checker's rules (check.py), and the harness on
a 3-member etcd cluster (etcd.py) and on a real Kubernetes control plane (kubernetes.py).

The runs themselves are in tests/chaos (``python -m tests.chaos``, docs/chaos.md).
"""
