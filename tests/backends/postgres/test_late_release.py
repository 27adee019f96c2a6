"""A release held until after the next renewal, on both PostgreSQL backends
(tests/support/held_release.py): the lease backend conditions its release on the version last
answered, and the engine never leads again on a term whose release is in doubt; the advisory
backend's release runs on the lock's own session, so no renewal can come between."""

from __future__ import annotations

import pytest

from tests.backends.postgres.helpers import unique
from tests.support.held_release import RESIGNS, leader_behind_a_proxy, resign_with_the_release_held
from tests.support.pgserver import PgServer

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.mark.parametrize("resign", RESIGNS)
@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+advisory"])
def test_a_release_held_until_after_the_next_renewal_leaves_one_leader(
    pg: PgServer, scheme: str, resign: str
) -> None:
    url = pg.dsn(scheme=scheme, table=unique("late"))
    rewrite = (f":{pg.port}/", ":{port}/")
    with leader_behind_a_proxy(url, (pg.host, pg.port), rewrite) as (proxied, a, b):
        # The resign's release names its end reason in its Bind: hold exactly that message
        # ("handed over to node-b" for a switchover, "resigned" for a plain resign).
        ended = b"handed over to node-b" if "to=node-b" in resign else b"resigned"
        resign_with_the_release_held(proxied, a, b, ended, resign)
