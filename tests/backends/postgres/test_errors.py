"""The one error boundary of the PostgreSQL backends (postgres/conn.py, request): every driver,
socket and timeout error comes out as BackendUnavailable or BackendFatal, redacted."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from leaderd.backends import BackendFatal, BackendUnavailable, Candidate
from leaderd.backends.base import BackendError
from leaderd.backends.postgres.conn import request
from leaderd.backends.postgres.settings import PgSettings
from tests.backends.postgres.helpers import opened, unique
from tests.support.backend_calls import ask
from tests.support.pgserver import PgServer

SECRET = "s3cr3t-in-a-message"
PG = PgSettings.from_url(f"postgresql://leaderd:{SECRET}@db.invalid/leaderd", "leaderd_lease")

# (exception raised inside the boundary, the class that must come out)
CASES: list[tuple[BaseException, type[BackendError]]] = [
    # Retrying cannot help: credentials, database, schema, privileges, objects, data.
    (asyncpg.InvalidPasswordError("password authentication failed"), BackendFatal),
    (asyncpg.InvalidCatalogNameError('database "x" does not exist'), BackendFatal),
    (asyncpg.InvalidSchemaNameError('schema "x" does not exist'), BackendFatal),
    (asyncpg.InsufficientPrivilegeError("permission denied for table t"), BackendFatal),
    (asyncpg.UndefinedTableError('relation "t" does not exist'), BackendFatal),
    (asyncpg.DataError("invalid input"), BackendFatal),
    (asyncpg.ClientConfigurationError("bad sslmode"), BackendFatal),
    (asyncpg.UnsupportedServerFeatureError("no such feature"), BackendFatal),
    # Transient: the server is busy, restarting, read-only for now, or went away.
    (asyncpg.SerializationError("could not serialize access"), BackendUnavailable),
    (asyncpg.DeadlockDetectedError("deadlock detected"), BackendUnavailable),
    (asyncpg.AdminShutdownError("terminating connection"), BackendUnavailable),
    (asyncpg.CannotConnectNowError("the database system is starting up"), BackendUnavailable),
    (asyncpg.TooManyConnectionsError("too many clients"), BackendUnavailable),
    (asyncpg.QueryCanceledError("canceling statement"), BackendUnavailable),
    (asyncpg.ReadOnlySQLTransactionError("read-only transaction"), BackendUnavailable),
    (asyncpg.ConnectionDoesNotExistError("connection was closed"), BackendUnavailable),
    (asyncpg.InterfaceError("another operation is in progress"), BackendUnavailable),
    (asyncpg.InternalClientError("protocol state"), BackendUnavailable),
    (asyncpg.exceptions.ProtocolError("unexpected message"), BackendUnavailable),
    (OSError(111, "Connection refused"), BackendUnavailable),
    (ConnectionResetError(104, "Connection reset by peer"), BackendUnavailable),
    (BrokenPipeError(32, "Broken pipe"), BackendUnavailable),
    (EOFError(), BackendUnavailable),
    (TimeoutError(), BackendUnavailable),
]


@pytest.mark.parametrize(("raised", "expected"), CASES, ids=lambda c: type(c).__name__)
async def test_each_driver_error_comes_out_as_the_backends_own(
    raised: BaseException, expected: type[BackendError]
) -> None:
    raised.args = (*raised.args, f"postgresql://leaderd:{SECRET}@db.invalid/leaderd")
    with pytest.raises(BackendError) as info:
        async with request(PG, "renewing the lease", timeout=5):
            raise raised
    assert type(info.value) is expected, info.value
    message = str(info.value)
    assert message.startswith("renewing the lease on postgresql://leaderd:***@db.invalid")
    assert SECRET not in message and "\n" not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


async def test_the_boundary_bounds_the_time_and_lets_cancellation_through() -> None:
    with pytest.raises(BackendUnavailable, match=r"timed out after 0\.05s"):
        async with request(PG, "reading the lease", timeout=0.05):
            await asyncio.sleep(5)
    with pytest.raises(BackendUnavailable, match="no time left"):
        async with request(PG, "reading the lease", timeout=0):
            pytest.fail("ran without time left")

    async def cancelled() -> None:
        async with request(PG, "reading the lease", timeout=5):
            await asyncio.sleep(5)

    task = asyncio.create_task(cancelled())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # A bug is not a driver error: it is not disguised as an outage.
    with pytest.raises(KeyError):
        async with request(PG, "reading the lease", timeout=5):
            raise KeyError("bug")


A = Candidate("node-a", "10.0.0.1:80")


class _Failing:
    """A real connection (or prepared statement) whose next statement fails with ``exc``
    (a driver fault that a real server cannot be made to produce on demand), as asyncpg
    would raise it."""

    def __init__(self, conn: Any, exc: BaseException) -> None:
        self._conn, self._exc = conn, exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def fetchrow(self, *args: Any, **kwargs: Any) -> Any:
        raise self._exc


@pytest.mark.postgres
@pytest.mark.parametrize("path", ["keepalive", "campaign"])
async def test_an_internal_client_error_in_the_advisory_backend_is_translated(
    pg_server: PgServer, path: str
) -> None:
    u, e = pg_server.dsn(scheme="postgresql+advisory", table=unique("adv")), unique()
    async with opened(u, e) as a:
        session = a._sessions[e]  # type: ignore[attr-defined]
        if path == "keepalive":
            assert (await ask(a, e, A, ttl=15, timeout=5)).holder == A.node_id
        else:
            await a.observe(e)  # opens the session
        fault = asyncpg.InternalClientError("protocol state")
        session.conn = _Failing(session.conn, fault)
        session.cas = _Failing(session.cas, fault)  # the prepared claim-and-renew statement
        with pytest.raises(BackendUnavailable, match="InternalClientError"):
            await ask(a, e, A, ttl=15, timeout=5)
