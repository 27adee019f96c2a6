"""`run --once-per` job records beside the advisory backend's companion table
(backends/jobs.py, docs/run.md): ``<table>_jobs``, exactly as for the lease table (jobs.py).

The advisory lock is the lease, so a start is recorded only while this process's lock
session still holds it: in the one statement that writes the record, the companion row must
name the candidate with the term, its lease (last keepalive + ttl) unexpired on the server's
clock, and ``pg_locks`` must show the lock granted to the session the row names (its pid,
and its start where visible: a pid alone is reused). The row is read ``FOR SHARE``: a new
holder claims it with an update (advisory_sql.CAS) before it leads, so its claim waits for
this statement to commit, and a start that commits first is read by the new leader.
"""

from __future__ import annotations

from .advisory_sql import _KEY, _THIS_DATABASE
from .jobs import PostgresJobStore

# $1 election, $2 node id, $3 instance, $4 term.
HELD_BY_LOCK = f"""
    SELECT 1 FROM {{t}} AS c
    JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
        AND {_KEY} = c.lock_key AND l.pid = c.pid AND l.database = {_THIS_DATABASE}
    LEFT JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE c.election = $1 AND c.holder = $2 AND c.instance = $3 AND c.term = $4
        AND c.expires_at > clock_timestamp()
        AND (a.backend_start IS NULL OR c.backend_start IS NULL
             OR a.backend_start = c.backend_start)
    FOR SHARE OF c"""


class AdvisoryJobStore(PostgresJobStore):
    HELD = HELD_BY_LOCK
    DEFAULT_TABLE = "leaderd_advisory"
