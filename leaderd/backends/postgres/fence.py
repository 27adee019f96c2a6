"""The fence function beside the lease table: the database itself refuses a stale leader's
write (docs/fencing.md).

``leaderd_fence(election, term)`` (``<table>_fence`` for a table not named leaderd_lease)
raises SQLSTATE LD001 unless ``term`` is the term of the lease's live holder, unexpired on
the server's clock at the moment of the call. It takes a share lock on the lease row, so
that no release, grant, renewal or takeover of that row commits until the calling
transaction ends: a write the fence let through commits before any hand-over. Leader
election itself never calls it, so a role that may not create it only loses the fence.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import asyncpg

from .conn import transaction
from .settings import PgSettings

log = logging.getLogger("leaderd.backends.postgresql")

STALE_TERM = "LD001"  # the SQLSTATE of a refused term
_MAX_IDENTIFIER = 63

# {f} the function, {t} the lease table, both qualified. clock_timestamp(), not now(): the
# calling transaction may have begun long before the call. SECURITY DEFINER, so that an
# application needs EXECUTE only, not UPDATE on the lease table (which FOR SHARE needs).
_CREATE = """
CREATE FUNCTION {f}(election text, term bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fence$
DECLARE
    held_by text;
    held_term bigint;
    expires timestamptz;
BEGIN
    SELECT l.holder, l.term, l.expires_at INTO held_by, held_term, expires
    FROM {t} AS l WHERE l.election = $1 FOR SHARE;
    IF held_by IS NULL OR held_term IS DISTINCT FROM $2 OR expires <= clock_timestamp() THEN
        RAISE EXCEPTION USING ERRCODE = '{code}',
            MESSAGE = format('leaderd fence: election %s is not led with term %s', $1, $2),
            DETAIL = format('the lease has term %s, %s', held_term, CASE
                WHEN held_term IS NULL THEN 'no such election'
                WHEN held_by IS NULL THEN 'released'
                WHEN expires <= clock_timestamp() THEN 'expired'
                ELSE 'held' END);
    END IF;
    RETURN $2;
END
$fence$"""
# Only roles the operator grants EXECUTE to may hold the lease row (and so delay renewals).
_REVOKE = "REVOKE ALL ON FUNCTION {f}(text, bigint) FROM PUBLIC"
_EXISTS = "SELECT to_regprocedure($1) IS NOT NULL"


def function_name(pg: PgSettings) -> str:
    """The fence function's name: leaderd_fence beside the default table, else <table>_fence."""
    name = "leaderd_fence" if pg.table == "leaderd_lease" else f"{pg.table}_fence"
    return name[:_MAX_IDENTIFIER]


def qualified_function(pg: PgSettings) -> str:
    return f'"{pg.schema}"."{function_name(pg)}"'


async def install(pg: PgSettings, conn: Any) -> None:
    """Create the fence function if it is missing (a table an older leaderd made gains it).
    A role that may not create it gets one warning saying what to run, and elections go on."""
    function = qualified_function(pg)
    if await conn.fetchval(_EXISTS, f"{function}(text, bigint)"):
        return
    create = _CREATE.format(f=function, t=pg.qualified_table, code=STALE_TERM)
    raced = (asyncpg.DuplicateFunctionError, asyncpg.UniqueViolationError)
    try:
        with contextlib.suppress(*raced):  # another daemon created it meanwhile
            async with transaction(conn):
                await conn.execute(create)
                await conn.execute(_REVOKE.format(f=function))
    except asyncpg.InsufficientPrivilegeError:
        log.warning(
            "%s: this role may not create the fence function %s (docs/fencing.md); "
            "elections work without it. As the schema's owner run the CREATE FUNCTION "
            "statement in docs/fencing.md",
            pg.description,
            function,
        )
