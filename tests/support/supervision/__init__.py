"""Daemons supervising a recording job (``run --``), as the supervisor tests and the
supervision bench start them: the cluster, the job (job.py), what it recorded, and the hosts
it is confined to (confine.py)."""
