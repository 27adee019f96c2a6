"""What the tests share across layers: real daemons, the PostgreSQL server, the etcd cluster
and the Kubernetes control plane with their fixtures, TLS material, backend calls, grants, held
releases, the holder lock, the referee, switchovers, the chaos harness (chaos/) and the
supervised jobs' cluster (supervision/)."""
