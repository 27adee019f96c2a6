"""Notes on a term (leaderd/election/term_notes.py: the hook failures during it) reach the
history on every backend: they ride on the release's end reason, whether the release frees
the lease, reserves it for a switchover, or grants it to an heir."""

from __future__ import annotations

from leaderd.backends.base import Capability
from leaderd.backends.records import EndReason, NotedReason
from tests.support.backend_calls import release

from .conftest import LONG_TTL, Store
from .test_contract import A, B, E, held
from .test_contract_records import reasons
from .test_grant import leading, stand_in_turn

NOTE = "on_elected hook failed with status 3; on_demoted hook timed out after 0.5s: killed"


async def test_a_release_records_the_terms_notes(store: Store) -> None:
    a, b = await store.new(), await store.new()
    first = await held(a, A)
    await release(a, E, A, first.term, NotedReason(EndReason.RESIGNED, NOTE))
    second = await held(b, B)
    assert reasons(await b.history(E, 10)) == [
        (second.term, B.node_id, None),
        (first.term, A.node_id, f"resigned; {NOTE}"),
    ]


async def test_a_switchover_records_the_terms_notes(store: Store) -> None:
    store.require(Capability.RESERVES)
    a, b = await store.new(), await store.new()
    first = await held(a, A)
    noted = NotedReason(EndReason.RESIGNED, NOTE)
    await release(a, E, A, first.term, noted, reserve_for=B.node_id, ttl=LONG_TTL)
    await held(b, B)
    assert reasons(await b.history(E, 10))[1] == (
        first.term, A.node_id, f"handed over to {B.node_id}; {NOTE}",
    )  # fmt: skip


async def test_a_grant_records_the_terms_notes(store: Store) -> None:
    store.require(Capability.GRANTS)
    a, mine = await leading(store)
    b = await store.new()
    await stand_in_turn(store, a, (b, B))
    await release(a, E, A, mine.term, NotedReason(EndReason.RELEASED, NOTE), grant=True)
    assert (await b.observe(E)).holder == B.node_id  # granted: B's term began in that write
    assert reasons(await b.history(E, 10))[1] == (mine.term, A.node_id, f"released; {NOTE}")
