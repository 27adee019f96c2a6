"""PostgreSQL connections: the one error boundary, durable sessions, and the tables.

Every request either backend sends runs inside ``request()``: the only place where a
driver, socket or timeout error becomes the backend's own (``BackendUnavailable`` or
``BackendFatal``, redacted). A session that writes leases commits durably whatever the
server's default is, and a read-only or recovering server is refused (docs/postgresql.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import asyncpg

from ...clock import boottime
from ..base import BackendError, BackendFatal, BackendUnavailable
from .settings import PgSettings

# Everything asyncpg may raise for a failed request: socket errors (OSError, which includes
# TimeoutError and ConnectionResetError), an EOF in the startup handshake, server errors,
# client state errors, and InternalClientError (a protocol state error after the server
# went away mid-statement), which derives from none of the others.
DRIVER_ERRORS = (
    OSError,
    EOFError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)

# SQLSTATE classes that retrying cannot fix: bad credentials (28), no such database (3D)
# or schema (3F), privileges/undefined objects/syntax (42), bad parameter values (22).
_FATAL_CLASSES = ("28", "3D", "3F", "42", "22")
_READ_ONLY = "25006"  # read_only_sql_transaction: a standby, or default_transaction_read_only
# What the loser of two daemons' CREATE ... IF NOT EXISTS gets: its check for the table
# ran before the winner committed, its insert into the catalog after (or waited for it).
_RACED_CREATE = (
    asyncpg.DuplicateTableError,
    asyncpg.DuplicateObjectError,
    asyncpg.UniqueViolationError,
)

# One round trip when a writing session starts: refuse a server that cannot take a durable
# write, and raise synchronous_commit to at least "on" (never lower a stronger remote_apply).
_PREPARE_WRITER = """
SELECT pg_is_in_recovery() AS in_recovery,
       current_setting('transaction_read_only') = 'on' AS read_only,
       CASE WHEN current_setting('synchronous_commit') IN ('off', 'local', 'remote_write')
            THEN set_config('synchronous_commit', 'on', false)
            ELSE current_setting('synchronous_commit') END AS synchronous_commit,
       pg_backend_pid() AS pid
"""
# leaderd's statements are prepared once per session and some run once per hand-over (a
# release, a claim): by default the server plans such a statement anew at each of its first
# five runs, on the hand-over's path. Their generic plans are as good (lookups by key in
# small tables). PostgreSQL 12 and later.
_GENERIC_PLANS = "SELECT set_config('plan_cache_mode', 'force_generic_plan', false)"
_COLUMNS = """
SELECT array_agg(attname::text) FROM pg_attribute
WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped
"""


def translate(pg: PgSettings, exc: BaseException, doing: str) -> BackendError:
    """A driver, socket or timeout exception as the backend's own, redacted."""
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, TimeoutError):
        return BackendUnavailable(f"{doing} on {pg.description}: timed out")
    reason = pg.scrub(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    message = f"{doing} on {pg.description}: {reason}"
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if sqlstate == _READ_ONLY:
        return BackendUnavailable(f"{message} (the server is read-only: leaderd needs the primary)")
    fatal = sqlstate[:2] in _FATAL_CLASSES or isinstance(
        exc, asyncpg.ClientConfigurationError | asyncpg.UnsupportedServerFeatureError
    )
    return BackendFatal(message) if fatal else BackendUnavailable(message)


@contextlib.asynccontextmanager
async def request(pg: PgSettings, doing: str, timeout: float | None = None) -> AsyncIterator[None]:
    """The error boundary of one PostgreSQL request, bounded by ``timeout`` seconds (None:
    no bound of its own). No driver exception leaves it untranslated; cancellation passes."""
    if timeout is not None and timeout <= 0:
        raise BackendUnavailable(f"{doing} on {pg.description}: no time left")
    try:
        async with asyncio.timeout(timeout):
            yield
    except TimeoutError:
        after = f" after {timeout:.3g}s" if timeout is not None else ""
        raise BackendUnavailable(f"{doing} on {pg.description}: timed out{after}") from None
    except BackendError:
        raise
    except DRIVER_ERRORS as exc:
        raise translate(pg, exc, doing) from None


async def connect(
    pg: PgSettings,
    timeout: float,
    server_settings: Mapping[str, str] | None = None,
    *,
    writer: bool = True,
) -> Any:
    """Open one connection within ``timeout`` (and ``connect_timeout``). A ``writer`` (every
    session but LISTEN's) commits durably and refuses a read-only or recovering server."""
    settings = {"application_name": pg.application_name, **(server_settings or {})}
    async with request(pg, "connecting", min(timeout, pg.connect_timeout)):
        conn = await asyncpg.connect(
            pg.dsn, server_settings=settings, statement_cache_size=20, command_timeout=None
        )
        try:
            if writer:
                await _prepare_writer(pg, conn)
        except BaseException:
            conn.terminate()
            raise
        return conn


async def _prepare_writer(pg: PgSettings, conn: Any) -> None:
    row = await conn.fetchrow(_PREPARE_WRITER)
    if row["in_recovery"]:
        raise BackendUnavailable(
            f"{pg.description} is a standby in recovery (read-only): leaderd writes leases "
            "on the primary only; retrying, a failover may promote it"
        )
    if row["read_only"]:
        raise BackendUnavailable(
            f"{pg.description} is read-only (default_transaction_read_only is on): leaderd "
            "writes leases on a writable primary only; retrying"
        )
    # Only on a session of our own: through a pooler (whose process id the connection
    # announced instead) a session setting would outlive our transaction, for other clients.
    if row["pid"] == conn.get_server_pid() and conn.get_server_version().major >= 12:
        await conn.execute(_GENERIC_PLANS)


@contextlib.asynccontextmanager
async def transaction(conn: Any, *, commit: bool = True) -> AsyncIterator[None]:
    """A transaction that a cancellation never waits on. asyncpg rolls a cancelled one back
    only once the server has answered the CancelRequest for its running statement, which a
    frozen server never does: the request, and the election loop awaiting it, would wait
    for the server to wake. A cancelled transaction ends its session instead, which the
    server rolls back. ``commit=False``: always rolled back."""
    started = conn.transaction()
    await started.start()
    try:
        yield
    except (asyncio.CancelledError, GeneratorExit):
        conn.terminate()
        raise
    except BaseException:
        await started.rollback()  # the server answered the failed statement: it is awake
        raise
    await (started.commit() if commit else started.rollback())


def rolled_back(conn: Any) -> contextlib.AbstractAsyncContextManager[None]:
    """A transaction that is always rolled back: statements run in it to be planned now (a
    generic plan, kept for the session) leave nothing behind."""
    return transaction(conn, commit=False)


async def ensure_table(pg: PgSettings, conn: Any, create: str, columns: Mapping[str, str]) -> None:
    """Create the table if it is missing, and add the ``columns`` (name: type and default)
    that an older leaderd's table lacks: an upgrade needs no manual step."""
    table = pg.qualified_table
    have = await conn.fetchval(_COLUMNS, table)
    if have is None:
        await create_if_missing(conn, create.format(t=table), table)
        return
    missing = [name for name in columns if name not in have]
    if not missing:
        return
    alter = f"ALTER TABLE {table} " + ", ".join(
        f"ADD COLUMN IF NOT EXISTS {name} {columns[name]}" for name in missing
    )
    await alter_as_owner(pg, conn, alter, f"table {table} lacks the columns {', '.join(missing)}")


async def create_if_missing(conn: Any, create: str, table: str) -> None:
    """Run ``create``, a CREATE TABLE IF NOT EXISTS. Daemons that start together race to;
    the loser's error is no error once the winner's table is there."""
    try:
        await conn.execute(create)
    except _RACED_CREATE:
        if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table):
            raise  # not a race: another object holds the name


async def alter_as_owner(pg: PgSettings, conn: Any, alter: str, lacks: str) -> None:
    """Run an upgrade's ALTER TABLE; a role that may not gets one line naming it."""
    try:
        async with transaction(conn):
            await conn.execute("SET LOCAL lock_timeout = '5s'")
            await conn.execute(alter)
    except asyncpg.InsufficientPrivilegeError:
        raise BackendFatal(
            f"{pg.description}: {lacks} that this leaderd needs, and this role may not add "
            f"them; as the table's owner run: {alter}"
        ) from None


class Deadline:
    """A deadline for one request (CLOCK_BOOTTIME): what is left of ``timeout``."""

    def __init__(self, timeout: float) -> None:
        self.at = boottime() + max(0.0, timeout)

    def left(self) -> float:
        return max(0.0, self.at - boottime())


def quote_literal_ms(seconds: float) -> str:
    """A GUC duration in whole milliseconds, at least 1 (0 would mean 'no limit')."""
    return f"{max(1, round(seconds * 1000))}ms"


async def close_quietly(conn: Any, timeout: float = 2.0) -> None:
    """Close gracefully (after asyncpg's cancel of a running statement), else abort."""
    try:
        await conn.close(timeout=timeout)
    except (*DRIVER_ERRORS, TimeoutError):
        conn.terminate()


class Closer:
    """Closes connections in the background, so that a request never waits for asyncpg's
    cancel of a statement still running; ``wait`` for them all when shutting down."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def close(self, conn: Any) -> None:
        if conn is None or conn.is_closed():
            return
        task = asyncio.get_running_loop().create_task(close_quietly(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait(self) -> None:
        await asyncio.gather(*self._tasks)


def version_sql(alias: str) -> str:
    """The lease's ``version`` as leaderd reports it: the row's write counter, which every
    write by this leaderd moves, and the expiry in microseconds, which also moves under a
    leaderd older than that counter (a rolling upgrade): no renewal goes unseen."""
    return (
        f"({alias}.version::text || '.' || "
        f"coalesce(floor(extract(epoch FROM {alias}.expires_at) * 1000000)::bigint, 0)::text)"
    )
