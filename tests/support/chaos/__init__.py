"""The chaos harness's parts: the run (harness.py: settings.py's fault catalog dealt to
node.py's daemons), the faults by what they hit (process_faults.py, server_faults.py,
request_faults.py, sqlite_faults.py), the fault proxy and the wire protocols it reads, the
checker's rules (check.py), and the harness on a 3-member etcd cluster (etcd.py) and on a
real Kubernetes control plane (kubernetes.py).

The runs themselves are in tests/chaos (``python -m tests.chaos``, docs/chaos.md).
"""
