"""The advisory backend's key, lock-session settings, companion table and statements.

docs/postgresql.md shows each statement with the reasoning behind it.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from ..base import Candidate, Lease, heard_in
from . import records
from .conn import quote_literal_ms, version_sql
from .reservation import (
    CLEAR,
    COLUMNS,
    RESERVE,
    lease_from_row,
    released_lease,
    reservation_sql,
    reserved_sql,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS {t} (
    election      text PRIMARY KEY,
    lock_key      bigint NOT NULL,            -- the pg_advisory_lock key
    holder        text,                       -- node id; NULL when released
    instance      text NOT NULL DEFAULT '',   -- the holder's process token
    address       text NOT NULL DEFAULT '',
    term          bigint NOT NULL,            -- fencing token; never decreases
    acquired_at   timestamptz,
    released_at   timestamptz,
    pid           integer,                    -- the holder's lock session: its pid and
    backend_start timestamptz,                -- start (a pid alone is reused)
    expires_at    timestamptz,                -- last keepalive + ttl: the holder's lease
    version       bigint NOT NULL DEFAULT 0,  -- +1 on every write, keepalives too
    reserved_for   text,                      -- released for this node id only ...
    reserved_until timestamptz                -- ... until then (server clock)
)
"""
# Columns an older leaderd's table lacks (added on open).
UPGRADE = {
    "instance": "text NOT NULL DEFAULT ''",
    "backend_start": "timestamptz",
    "version": "bigint NOT NULL DEFAULT 0",
    **COLUMNS,
}

_KEY = "((l.classid::int8 << 32) | l.objid::int8)"
_THIS_DATABASE = "(SELECT oid FROM pg_database WHERE datname = current_database())"

TRY_LOCK = "SELECT pg_try_advisory_lock($1) AS granted, pg_backend_pid() AS pid"
# lock_timeout is set local to this one-statement transaction, before the lock is waited for.
LOCK = """
WITH cfg AS MATERIALIZED (SELECT set_config('lock_timeout', $2, true))
SELECT pg_advisory_lock($1)::text IS NOT NULL AS granted, pg_backend_pid() AS pid FROM cfg
"""
UNLOCK = "SELECT pg_advisory_unlock($1)"
UNLOCK_ALL = "SELECT pg_advisory_unlock_all()"
# Once per lock session: who it is (pid and start: a pid alone is reused).
SESSION = """
SELECT pg_backend_pid() AS pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()
"""

_COLUMNS = f"""
    c.holder, c.instance, c.address, c.term, c.acquired_at, {version_sql("c")} AS version,
    GREATEST(0, extract(epoch FROM c.expires_at - now()))::float8 AS expires_in,
    {reservation_sql("c")}"""
_MINE = "(c.holder = excluded.holder AND c.instance = excluded.instance)"
# This process's row still holds its term when it is claimed again (a renewal):
_LIVE = {
    # wait: while its lease lasts, even through a new session (after a server restart).
    "wait": "c.expires_at > now()",
    # immediate: a session's end is the lease's end, so only through the same session.
    "immediate": "(c.expires_at > now() AND c.pid = excluded.pid"
    " AND c.backend_start IS NOT DISTINCT FROM excluded.backend_start)",
}
_TAKEOVER = {
    # An unreleased holder's lease (its session ended under it) is over on the server's
    # clock, and the engine watched this very version for one ttl (docs/algorithm.md).
    "wait": f"(coalesce(c.expires_at <= now(), true) AND {version_sql('c')} = $8::text)",
    # The session's end freed the lock: the grant is enough (fence writes on term). ($8 is
    # unused, but typed so that the statement prepares.)
    "immediate": "(true OR $8::text = '')",
}
# One statement claims the lock's row (after a grant) and renews it (every keepalive): it
# applies only while this very session holds the lock, and then as the lease backend's
# rules say: free, this process's (a renewal unless expired), or a takeover.
# $1 election, $2 key, $3 node id, $4 instance, $5 address, $6 ttl, $7 channel,
# $8 takeover version, $9 min_term, $10 this session's backend_start (SESSION),
# $11 leaderd version, $12 lost_term. With it: the member's heartbeat and, when a term
# began, its history record (records.py).
CAS = f"""
WITH prev AS MATERIALIZED (
    SELECT holder, instance, term, expires_at FROM {{t}} WHERE election = $1
), me AS MATERIALIZED (
    SELECT pg_backend_pid() AS pid, $10::timestamptz AS started,
        EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted
                AND l.objsubid = 1 AND {_KEY} = $2 AND l.pid = pg_backend_pid()) AS locked
), cas AS (
    INSERT INTO {{t}} AS c (election, lock_key, holder, instance, address, term, acquired_at,
                           released_at, pid, backend_start, expires_at, version)
    SELECT $1, $2, $3, $4, $5, GREATEST(1, $9::bigint), now(), NULL, me.pid, me.started,
           now() + make_interval(secs => $6::float8), 1
    FROM me WHERE me.locked
    ON CONFLICT (election) DO UPDATE SET
        term = CASE WHEN {_MINE} AND {{live}}
                    THEN c.term ELSE GREATEST(c.term + 1, $9::bigint) END,
        acquired_at = CASE WHEN {_MINE} AND {{live}} THEN c.acquired_at ELSE now() END,
        lock_key = excluded.lock_key, holder = excluded.holder, instance = excluded.instance,
        address = excluded.address, released_at = NULL, pid = excluded.pid,
        backend_start = excluded.backend_start, expires_at = excluded.expires_at,
        version = c.version + 1, {CLEAR}
    WHERE (c.holder IS NULL AND NOT {reserved_sql("c", "excluded.holder")}) OR {_MINE}
       OR (c.holder IS NOT NULL AND {{takeover}})
    RETURNING {_COLUMNS}
), {records.HEARD}, {records.HISTORY_CTES}
SELECT cas.*, me.pid AS session_pid, me.locked,
    CASE WHEN cas.acquired_at = now() THEN pg_notify($7, cas.term || ' acquired ' || $1)::text
    END AS notified, {records.MEMBERS} AS members
FROM cas, me
UNION ALL
SELECT {_COLUMNS}, me.pid, me.locked, NULL, {records.MEMBERS}
FROM me LEFT JOIN {{t}} AS c ON c.election = $1
WHERE NOT EXISTS (SELECT FROM cas)
"""
_CAS_ARGS = {"e": "$1", "n": "$3", "i": "$4", "a": "$5", "ttl": "$6", "v": "$11", "lost": "$12",
             "c": "true", "who": records.who("$13", "$14", "$15")}  # fmt: skip
# $1 election, $2 key: the companion row and the session holding the lock (if any);
# ``recorded``: that session is the one the row names (pid and start: pids are reused).
OBSERVE = f"""
SELECT {_COLUMNS}, {records.MEMBERS} AS members, l.pid AS lock_pid,
    coalesce(l.pid = c.pid AND (a.backend_start IS NULL OR c.backend_start IS NULL
                                OR a.backend_start = c.backend_start), false) AS recorded
FROM (SELECT) AS one
LEFT JOIN {{t}} AS c ON c.election = $1
LEFT JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
    AND {_KEY} = $2 AND l.database = {_THIS_DATABASE}
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
"""
# The same, registering a member: $3 node id, $4 instance, $5 address, $6 ttl, $7 version,
# $8 lost_term (a standby's rounds are reads: they relabel its lost term too), $9 priority,
# $10 health, $11 switchover.
OBSERVE_HEARD = f"WITH {records.HEARD}, {records.RELABELED}\n{OBSERVE}"
_OBSERVE_ARGS = {"e": "$1", "n": "$3", "i": "$4", "a": "$5", "ttl": "$6", "v": "$7", "lost": "$8",
                 "c": "false", "who": records.who("$9", "$10", "$11")}  # fmt: skip
# $1 election, $2 node id, $3 instance, $4 term, $5 channel, $6 reserved for ('': none), $7
# its seconds, $8 end reason, $9 the version last answered ('': any). It commits on its own,
# before the lock is freed (UNLOCK, the next statement): a standby granted the lock never reads
# the row as it was before the release.
RELEASE = f"""
WITH released AS (
    UPDATE {{t}} AS c SET holder = NULL, instance = '', address = '', released_at = now(),
        version = c.version + 1, {RESERVE}
    WHERE election = $1 AND holder = $2 AND instance = $3 AND term = $4
      AND ($9::text = '' OR {version_sql("c")} = $9::text)
    RETURNING term
), {records.RELEASED}
SELECT pg_notify($5, term || ' released ' || $1)::text FROM released
"""


def statements(table: str, names: dict[str, str], takeover: str) -> dict[str, str]:
    """Every statement of the backend for the lease ``table`` and its records' tables."""
    live, take = _LIVE[takeover], _TAKEOVER[takeover]
    return {
        "cas": CAS.format(t=table, live=live, takeover=take, **names, **_CAS_ARGS),
        "observe": OBSERVE.format(t=table, **names, e="$1"),
        "observe_heard": OBSERVE_HEARD.format(t=table, **names, **_OBSERVE_ARGS),
        "release": RELEASE.format(t=table, **names, e="$1", reason="$8"),
        "history": records.HISTORY.format(**names),
    }


def row_lease(
    election: str,
    row: Any,
    live: bool,
    me: Candidate | None = None,
    ttl: float = 0.0,
    asked: bool = False,
) -> Lease:
    """A row that names a holder; ``live``: its session holds the lock (no expiry).
    ``me``: the candidate whose heartbeat this statement was (``asked``: a claim), listed
    as heard now."""
    members = records.members(row["members"], me, ttl, asked)
    expires_in = None if live else max(0.0, float(row["expires_in"] or 0.0))
    return heard_in(lease_from_row(election, row, expires_in, members), me)


def free_lease(election: str, row: Any, me: Candidate | None, ttl: float) -> Lease:
    """The lock is free (or about to be): the row's term, its reservation while it lasts,
    and the members it lists (``me``: heard by this statement)."""
    return heard_in(released_lease(election, row, records.members(row["members"], me, ttl)), me)


def advisory_key(election: str) -> int:
    """The lock key: sha256("leaderd:" + election)[:8] as a signed 64-bit integer."""
    digest = hashlib.sha256(b"leaderd:" + election.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def session_settings(ttl: float) -> dict[str, str]:
    """GUCs of a lock session: the server may end it only >= ttl after its last request."""
    return {
        "idle_session_timeout": quote_literal_ms(math.ceil(ttl * 1000) / 1000),
        "tcp_user_timeout": str(math.ceil(ttl * 1000)),
        "tcp_keepalives_idle": str(math.ceil(ttl)),
        "tcp_keepalives_interval": str(max(1, math.ceil(ttl / 3))),
        "tcp_keepalives_count": "3",
        # A standby that went away while blocked leaves the lock queue within this.
        "client_connection_check_interval": "500ms",
    }
