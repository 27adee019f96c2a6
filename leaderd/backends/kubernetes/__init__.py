"""kubernetes:// — one coordination.k8s.io/v1 Lease per election on the API server itself
(docs/kubernetes.md): config.py finds the server and credentials, transport.py speaks HTTP,
codec.py reads and writes the Lease object, members.py the companion member Leases, watch.py
wakes standbys, backend.py decides."""
