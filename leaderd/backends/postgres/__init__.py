"""The PostgreSQL backends, the lease-row one (lease.py) and the advisory-lock one
(advisory.py), and the connection, LISTEN, record and reservation code they share
(docs/postgresql.md)."""
