"""The PostgreSQL members and history tables, shared by the lease and advisory backends
(docs/postgresql.md): SQL fragments that join the statements those backends already send,
so a member's heartbeat and a holder's record add no request, and a record is written in
the very transaction that changes the holder.

``<table>_members`` and ``<table>_history`` sit in the lease table's schema and are created
if missing; the lease table itself is untouched. Ages and times are the server's ``now()``.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import asyncpg
import orjson

from ..base import BackendFatal, Candidate
from ..records import HISTORY_RETENTION, PRUNE_AFTER_TTLS, EndReason, Member, Tenure
from .conn import alter_as_owner, create_if_missing
from .settings import PgSettings

_CREATE = """
CREATE TABLE IF NOT EXISTS {m} (
    election  text NOT NULL,
    node_id   text NOT NULL,
    instance  text NOT NULL,
    address   text NOT NULL DEFAULT '',
    version   text NOT NULL DEFAULT '',      -- the member's leaderd version
    ttl       float8 NOT NULL,               -- stale once not heard from for this long
    heard_at  timestamptz NOT NULL,          -- server clock
    campaigning boolean NOT NULL DEFAULT false, -- heard asking for the lease (a grant may go to it)
    priority  integer NOT NULL DEFAULT 1,    -- a grant prefers the highest, 0 never leads
    health    text NOT NULL DEFAULT '',      -- why its health checks fail, '' while they pass
    switchover text NOT NULL DEFAULT '',     -- the switchover it asks the leader for
    PRIMARY KEY (election, node_id, instance)
);
CREATE TABLE IF NOT EXISTS {h} (
    election    text NOT NULL,
    term        bigint NOT NULL,
    holder      text NOT NULL,
    instance    text NOT NULL DEFAULT '',
    address     text NOT NULL DEFAULT '',
    acquired_at timestamptz NOT NULL,
    ended_at    timestamptz,                 -- NULL while the term lasts
    end_reason  text,                        -- released, resigned, expired, ...
    PRIMARY KEY (election, term)
)
"""

_COLUMNS = """
SELECT array_agg(attname::text) FROM pg_attribute
WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped
"""
# Columns an older leaderd's members table lacks, added on open.
_ADDED = {
    "campaigning": "boolean NOT NULL DEFAULT false",
    "priority": "integer NOT NULL DEFAULT 1",
    "health": "text NOT NULL DEFAULT ''",
    "switchover": "text NOT NULL DEFAULT ''",
}

# The member's heartbeat and the pruning of the long-silent, as CTEs. Placeholders name the
# statement's parameters: {e} election, {n} node id, {i} instance, {a} address, {v} version,
# {ttl} the member's ttl in seconds; {c} is true when the statement asks for the lease;
# {who} its priority and health (``who``).
HEARD = f"""
heard AS (
    INSERT INTO {{m}} (election, node_id, instance, address, version, ttl, heard_at, campaigning,
                       priority, health, switchover)
    VALUES ({{e}}, {{n}}, {{i}}, {{a}}, {{v}}::text, {{ttl}}::float8, now(), {{c}}, {{who}})
    ON CONFLICT (election, node_id, instance) DO UPDATE SET address = excluded.address,
        version = excluded.version, ttl = excluded.ttl, heard_at = now(),
        campaigning = excluded.campaigning, priority = excluded.priority,
        health = excluded.health, switchover = excluded.switchover
    RETURNING 1
), pruned AS (
    DELETE FROM {{m}} WHERE election = {{e}}
        AND heard_at < now() - make_interval(secs => ttl * {PRUNE_AFTER_TTLS})
        AND NOT (node_id = {{n}} AND instance = {{i}})
    RETURNING 1
)"""
# The members as this statement's snapshot shows them, and the server's now().
MEMBERS = """(
    SELECT json_build_object('now', now(), 'members', coalesce(json_agg(json_build_array(
        node_id, instance, address, version, ttl, heard_at,
        extract(epoch FROM now() - heard_at)::float8, campaigning, priority, health, switchover)
        ORDER BY node_id, instance), '[]'))
    FROM {m} WHERE election = {e}
)::text"""
# A record this process ended "lost the backend", once another request ended it otherwise.
RELABELED = f"""relabeled AS (
    UPDATE {{h}} SET end_reason = '{EndReason.LOST_BACKEND}'
    WHERE election = {{e}} AND term = {{lost}}::bigint AND holder = {{n}} AND instance = {{i}}
      AND ended_at IS NOT NULL
    RETURNING 1
)"""


def _opened(columns: str, source: str) -> str:
    """The CTEs that open a term's record (``columns``: term, holder, instance, address,
    from ``source``) and keep the newest HISTORY_RETENTION; {h} and {e} stay placeholders."""
    # The statement's snapshot does not show the record it opens: keep one fewer.
    return f"""opened AS (
    INSERT INTO {{h}} (election, term, holder, instance, address, acquired_at)
    SELECT {{e}}, {columns}, now() FROM {source}
    ON CONFLICT (election, term) DO UPDATE SET holder = excluded.holder,
        instance = excluded.instance, address = excluded.address,
        acquired_at = excluded.acquired_at, ended_at = NULL, end_reason = NULL
    RETURNING 1
), retained AS (
    DELETE FROM {{h}} WHERE election = {{e}} AND EXISTS (SELECT FROM {source}) AND term < (
        SELECT min(term) FROM (SELECT term FROM {{h}} WHERE election = {{e}}
                               ORDER BY term DESC LIMIT {HISTORY_RETENTION - 1}) AS newest)
    RETURNING 1
)"""


# History CTEs for an acquisition: ``prev`` is the lease row before the statement, ``cas``
# the claim's RETURNING (term, acquired_at). A term that began now ends the open records
# below it, opens its own, and keeps the newest HISTORY_RETENTION. {lost} is the lost_term
# parameter: this process stepped down from that term unable to reach the server.
HISTORY_CTES = f"""
began AS (SELECT term FROM cas WHERE acquired_at = now()),
ended AS (
    UPDATE {{h}} AS h SET
        ended_at = CASE WHEN p.holder IS NULL THEN now()
                        ELSE LEAST(now(), coalesce(p.expires_at, now())) END,
        end_reason = CASE
            WHEN p.holder IS NULL THEN '{EndReason.RELEASED}'
            WHEN p.holder = {{n}} AND p.instance = {{i}} AND h.term = {{lost}}::bigint
                THEN '{EndReason.LOST_BACKEND}'
            WHEN p.holder = {{n}} AND p.instance = {{i}} THEN '{EndReason.EXPIRED}'
            ELSE '{EndReason.TAKEN_OVER}' END
    FROM began, prev AS p
    WHERE h.election = {{e}} AND h.ended_at IS NULL AND h.term < began.term
    RETURNING 1
), {RELABELED}, {_opened("term, {n}, {i}, {a}", "began")}
"""
# The release's CTE: ``released`` is the release's RETURNING (term); {reason} its reason.
RELEASED = """
ended AS (
    UPDATE {h} AS h SET ended_at = now(), end_reason = {reason}::text FROM released AS r
    WHERE h.election = {e} AND h.term = r.term AND h.ended_at IS NULL
    RETURNING 1
)"""
# A releasing process no longer asks for the lease: no later release may grant it back.
WITHDRAWN = """
withdrawn AS (
    UPDATE {m} SET campaigning = false WHERE election = {e} AND node_id = {n} AND instance = {i}
    RETURNING 1
)"""
# A release's grant (docs/algorithm.md, "One-write hand-over"): ``released`` is its RETURNING
# (new_term, holder, instance, address; holder NULL when nobody was granted the lease).
GRANTED = "granted AS (SELECT * FROM released WHERE holder IS NOT NULL), " + _opened(
    "new_term, holder, instance, address", "granted"
)
# $1 election, $2 how many.
HISTORY = """
SELECT election, term, holder, instance, address, acquired_at, ended_at, end_reason
FROM {h} WHERE election = $1 ORDER BY term DESC LIMIT $2
"""


def tables(pg: PgSettings) -> dict[str, str]:
    """The qualified names of the members ({m}) and history ({h}) tables."""
    return {"m": f'"{pg.schema}"."{pg.table}_members"', "h": f'"{pg.schema}"."{pg.table}_history"'}


async def create(pg: PgSettings, conn: Any) -> None:
    """Create both tables if missing; two daemons may race to, the loser sees the winner's."""
    sql = _CREATE.format(**tables(pg))
    try:
        # One at a time: losing the race for one skips no other.
        for table, statement in zip(tables(pg).values(), sql.split(";"), strict=True):
            await create_if_missing(conn, statement, table)
    except asyncpg.InsufficientPrivilegeError:
        raise BackendFatal(
            f"{pg.description}: leaderd keeps members and history in {tables(pg)['m']} and "
            f"{tables(pg)['h']}, and this role may not create them; as the schema's owner "
            f"run: {_one_line(sql)}; and grant this role SELECT, INSERT, UPDATE, DELETE on both"
        ) from None
    await _upgrade_members(pg, conn)


async def _upgrade_members(pg: PgSettings, conn: Any) -> None:
    """Add the columns a members table an older leaderd created lacks (one ALTER)."""
    members = tables(pg)["m"]
    present = set(await conn.fetchval(_COLUMNS, members) or ())
    missing = [column for column in _ADDED if column not in present]
    if not missing:
        return
    adds = ", ".join(f"ADD COLUMN IF NOT EXISTS {c} {_ADDED[c]}" for c in missing)
    lacks = f"table {members} lacks the column(s) {', '.join(missing)}"
    await alter_as_owner(pg, conn, f"ALTER TABLE {members} {adds}", lacks)


def _one_line(sql: str) -> str:
    """A statement without its comments, on one line (an error message is one line)."""
    return " ".join(re.sub(r"--[^\n]*", "", sql).split()).rstrip(";")


def who(p: str, h: str, s: str) -> str:
    """The {who} of HEARD: priority, health and switchover from parameters ``p``, ``h``, ``s``."""
    return f"{p}::integer, {h}::text, {s}::text"


def members(
    text: str | None, me: Candidate | None, ttl: float, campaigning: bool = False
) -> tuple[Member, ...]:
    """The MEMBERS column as Members; ``me`` (heard by this very statement, which its own
    snapshot does not show; ``campaigning`` if it asked for the lease) as heard at the
    server's now."""
    if not text:
        return ()
    data = orjson.loads(text)
    now = _when(data["now"])
    found = {
        (n, i): Member(n, i, a, v, float(t), _when(at), max(0.0, float(ago)), *rest)
        for n, i, a, v, t, at, ago, *rest in data["members"]
    }
    if me is not None:
        mine = Member(me.node_id, me.instance, me.address, me.leaderd_version, ttl, now, 0.0,
                      campaigning, me.priority, me.health, me.switchover)  # fmt: skip
        found[me.node_id, me.instance] = mine
    return tuple(found[key] for key in sorted(found))


def tenures(rows: list[Any]) -> list[Tenure]:
    columns = ("holder", "instance", "address", "acquired_at", "ended_at", "end_reason")
    return [Tenure(r["election"], int(r["term"]), *(r[c] for c in columns)) for r in rows]


def _when(text: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(text) if text else None
