"""The statements on a hand-over's path are planned before the hand-over (postgres/conn.py keeps
generic plans; postgres/lease.py and postgres/advisory.py run them once in a transaction
rolled back): the release and the claim after a grant run on a plan the session already has.

Without it each of their first runs was planned on the spot: 1-3 ms on an idle machine,
up to 8 ms while the daemons and the server busy both cores (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

import pytest

from leaderd.backends import Candidate
from leaderd.backends.postgres.advisory import PostgresAdvisoryBackend
from leaderd.backends.postgres.lease import PostgresLeaseBackend
from tests.backends.postgres.helpers import admin, opened, unique
from tests.backends.postgres.test_advisory import queued_hand_over
from tests.support.backend_calls import ask, release
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.postgres

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
LEASE_RELEASE = "heir AS MATERIALIZED"  # the lease backend's release (and grant)
ADVISORY_CLAIM = "me AS MATERIALIZED"
ADVISORY_RELEASE = "WITH released AS ("


async def plans(conn: Any, marker: str) -> tuple[int, int]:
    """(generic plans used, custom plans made) of the session's statement with ``marker``."""
    rows = await conn.fetch(
        "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
    )
    found = [(r["generic_plans"], r["custom_plans"]) for r in rows if marker in r["statement"]]
    prepared = [" ".join(r["statement"].split())[:60] for r in rows]
    assert len(found) == 1, f"{marker!r} is not prepared in this session, only: {prepared}"
    return found[0]


def pooled(backend: Any) -> Any:
    assert isinstance(backend, PostgresLeaseBackend)
    (conn,) = backend._pool._idle
    return conn


def session(backend: Any, election: str) -> Any:
    assert isinstance(backend, PostgresAdvisoryBackend)
    return backend._sessions[election].conn


async def test_the_lease_release_is_planned_when_its_connection_opens(pg_server: PgServer) -> None:
    u, e = pg_server.dsn(table=unique("t")), unique()
    async with opened(u, e) as a, opened(u, e) as b:
        held = await ask(a, e, A, ttl=4, timeout=5)
        await ask(b, e, B, ttl=4, timeout=5)
        assert await plans(pooled(a), LEASE_RELEASE) == (1, 0)  # the rolled-back run
        await release(a, e, A, held.term, grant=True)
        assert await plans(pooled(a), LEASE_RELEASE) == (2, 0)  # planned nothing
        assert (await b.observe(e)).held_by(B)  # the grant went through, the dry run did not


async def test_the_advisory_claim_and_release_are_planned_before_the_lock_wait(
    pg_server: PgServer,
) -> None:
    u, e = pg_server.dsn(scheme="postgresql+advisory", table=unique("adv")), unique()
    async with opened(u, e) as a, opened(u, e) as b, admin(pg_server) as other:
        term = await queued_hand_over(a, b, other, e)
        assert await plans(session(a, e), ADVISORY_RELEASE) == (2, 0)  # dry run, release
        assert await plans(session(b, e), ADVISORY_CLAIM) == (2, 0)  # dry run, claim
        assert (await b.observe(e)).term == term  # a dry run's term -1 changed nothing
