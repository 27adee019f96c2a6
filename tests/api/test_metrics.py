"""/metrics through an election's life, and MeteredBackend on its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from leaderd import __version__
from leaderd.api.metrics import MeteredBackend, Metrics
from leaderd.backends.base import BackendFatal, BackendUnavailable, Candidate
from leaderd.backends.sqlite.backend import SQLiteBackend
from leaderd.backends.static import StaticBackend
from tests.support.backend_calls import ask, release

from .conftest import eventually

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


async def scrape(client: Any) -> Samples:
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.content_type == "text/plain"
    return parse(await resp.text())


async def test_metrics_follow_an_election(api: Any, sqlite_backend: SQLiteBackend) -> None:
    metrics = Metrics()
    node, client = await api(["default", "jobs"], backend=sqlite_backend, metrics=metrics)
    election = node.elections["default"]
    await eventually(lambda: all(e.status().is_leader for e in node.elections.values()))

    samples = await scrape(client)
    first = {name: e.status().term for name, e in node.elections.items()}  # a new file's seed
    assert value(samples, "leaderd_build_info", version=__version__) == 1
    for name in ("default", "jobs"):
        assert value(samples, "leaderd_is_leader", election=name) == 1
        assert value(samples, "leaderd_term", election=name) == first[name]
        assert value(samples, "leaderd_transitions_total", election=name) == 1
        assert value(samples, "leaderd_watchers", election=name) == 0
        valid = value(samples, "leaderd_lease_valid_seconds", election=name)
        assert 0 < valid <= 3.0
    calls = value(
        samples,
        "leaderd_backend_request_seconds_count",
        backend="sqlite",
        operation="acquire_or_renew",
    )
    assert calls >= 2  # at least one acquisition per election, each timed
    assert value(
        samples, "leaderd_backend_request_seconds_count", backend="sqlite", operation="open"
    )

    # Resign: is_leader flips at once (derived at scrape time), a transition is counted.
    election.resign(0.5)
    samples = await scrape(client)
    assert value(samples, "leaderd_is_leader", election="default") == 0
    assert value(samples, "leaderd_lease_valid_seconds", election="default") == 0
    assert value(samples, "leaderd_transitions_total", election="default") == 2
    assert value(samples, "leaderd_is_leader", election="jobs") == 1
    assert value(samples, "leaderd_transitions_total", election="jobs") == 1

    # After the cooldown it leads again with the next term.
    await eventually(lambda: election.status().is_leader)
    samples = await scrape(client)
    assert value(samples, "leaderd_is_leader", election="default") == 1
    assert value(samples, "leaderd_term", election="default") == first["default"] + 1
    assert value(samples, "leaderd_transitions_total", election="default") == 3
    assert value(samples, "leaderd_term", election="jobs") == first["jobs"]
    assert value(
        samples, "leaderd_backend_request_seconds_count", backend="sqlite", operation="release"
    )


async def test_watchers_gauge_counts_waiting_clients(api: Any) -> None:
    import asyncio

    node, client = await api()
    election = node.elections["default"]
    await eventually(lambda: election.status().is_leader)
    revision = election.status().revision
    poll = asyncio.ensure_future(client.get(f"/watch?revision={revision}&timeout=30"))
    stream = await client.get("/watch?stream=1")
    await stream.content.readline()
    await eventually(lambda: election.watchers == 2)
    assert value(await scrape(client), "leaderd_watchers", election="default") == 2
    election.resign(60)
    await poll
    stream.close()
    await eventually(lambda: election.watchers == 0)
    assert value(await scrape(client), "leaderd_watchers", election="default") == 0


async def test_is_leader_is_derived_at_scrape_time(aiohttp_client: Any) -> None:
    """After a pause past the deadline, the first scrape says 0: nothing timer-driven."""
    from leaderd.api.server import build_app
    from leaderd.election.engine import Election
    from leaderd.election.node import Node

    from .conftest import FAST
    from .test_node_endpoints import StepClock

    backend = StaticBackend()
    clock = StepClock()
    election = Election("default", Candidate("node-a"), FAST, backend, clock=clock)
    client = await aiohttp_client(build_app(Node("node-a", backend, {"default": election})))
    await election.round()  # one acquisition, and no loop to renew it
    samples = await scrape(client)
    assert value(samples, "leaderd_is_leader", election="default") == 1
    assert value(samples, "leaderd_transitions_total", election="default") == 1
    clock.offset = FAST.lease_window  # the process was frozen until its deadline
    samples = await scrape(client)
    assert value(samples, "leaderd_is_leader", election="default") == 0
    assert value(samples, "leaderd_lease_valid_seconds", election="default") == 0
    assert value(samples, "leaderd_transitions_total", election="default") == 2


class FlakyBackend(StaticBackend):
    def __init__(self, failures: Sequence[Exception]) -> None:
        super().__init__()
        self.failures = list(failures)

    async def observe(self, election: str, *args: Any) -> Any:
        if self.failures:
            raise self.failures.pop(0)
        return await super().observe(election, *args)


async def test_metered_backend_counts_errors_and_passes_through() -> None:
    metrics = Metrics()
    inner = FlakyBackend([BackendUnavailable("db down"), BackendFatal("bad"), BackendUnavailable()])
    backend = metrics.wrap(inner)
    # Every kind is there at 0 before the first error, so increase() sees the first one.
    errors = "leaderd_backend_errors_total"
    zero = parse(metrics.exposition().decode())
    for kind in ("BackendUnavailable", "BackendFatal", "LeaseLost"):
        assert value(zero, errors, backend="static", kind=kind) == 0
    assert isinstance(backend, MeteredBackend)
    assert backend.kind == "static"
    assert backend.description == "static://"
    assert backend.capabilities is inner.capabilities
    await backend.open(["default"])
    for expected in (BackendUnavailable, BackendFatal, BackendUnavailable):
        with pytest.raises(expected):
            await backend.observe("default")
    candidate = Candidate("node-a")
    lease = await ask(backend, "default", candidate, ttl=3, timeout=1)
    assert lease == await inner.observe("default")
    assert lease.held_by(candidate) and lease.term == 1
    await backend.wait_for_change("default", 0.01)
    await release(backend, "default", candidate, 1)
    assert (await backend.observe("default")).holder is None

    samples = parse(metrics.exposition().decode())
    assert value(samples, errors, backend="static", kind="BackendUnavailable") == 2
    assert value(samples, errors, backend="static", kind="BackendFatal") == 1
    seconds = "leaderd_backend_request_seconds_count"
    assert value(samples, seconds, backend="static", operation="observe") == 4
    assert value(samples, seconds, backend="static", operation="acquire_or_renew") == 1
    assert value(samples, seconds, backend="static", operation="release") == 1
    assert value(samples, seconds, backend="static", operation="open") == 1
    # Waiting for a change is not a request.
    assert not any(dict(labels).get("operation") == "wait_for_change" for _, labels in samples)
    await backend.close()


async def test_two_daemons_do_not_share_a_registry(make_node: Any) -> None:
    first, second = Metrics(), Metrics()
    first.watch(await make_node(run=False))
    first.transitions.labels("default").inc()
    assert "leaderd_transitions_total" in first.exposition().decode()
    assert "leaderd_transitions_total{" not in second.exposition().decode()


async def test_metrics_are_leaderds_own(api: Any) -> None:
    """No process_* or python_* series: docs/metrics.md lists all there is (and the unit's
    ProcSubset comment relies on it)."""
    _, client = await api(["default"], metrics=Metrics())
    names = {name for name, _ in await scrape(client)}
    assert names and all(name.startswith("leaderd_") for name in names), sorted(names)
