"""Prometheus metrics (docs/metrics.md): one registry per daemon, filled without the engine or
the backends knowing about it.

* Election gauges are computed at scrape time by a collector that asks each engine, so
  ``leaderd_is_leader`` is derived from the deadline at the moment of the scrape.
* ``leaderd_transitions_total`` counts changes of this node's leadership (engine listener).
* Backend latency and errors come from ``MeteredBackend``, a wrapper around any backend.

Wiring: ``metrics = Metrics()``; ``backend = metrics.wrap(backend)``; build the elections
and the Node on it; ``metrics.watch(node)``; ``build_app(node, metrics=metrics)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator, Sequence
from typing import TypeVar

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..backends.asks import Ask, Release
from ..backends.base import Backend, BackendError, Candidate, Grant, Lease
from ..backends.records import Tenure
from ..clock import boottime
from ..election.engine import Election
from ..election.node import Node
from ..election.status import ElectionStatus
from .connections import Connections

# Backend round trips: sub-millisecond for SQLite, up to the request timeout for PostgreSQL.
T = TypeVar("T")

REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """The daemon's metrics and their registry."""

    def __init__(self, version: str = __version__) -> None:
        # No *_created series: they double the output and no leaderd alert needs them.
        # (prometheus-client < 0.17, as in Debian 12, has no switch: the series stay.)
        if hasattr(prometheus_client, "disable_created_metrics"):
            prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        self.transitions = Counter(
            "leaderd_transitions",
            "Changes of this node's leadership (became leader, or stopped being leader).",
            ["election"],
            registry=None,  # registered after the election collector: see watch()
        )
        self.backend_errors = Counter(
            "leaderd_backend_errors",
            "Backend requests that failed, by backend and exception class.",
            ["backend", "kind"],
            registry=self.registry,
        )
        self.backend_request_seconds = Histogram(
            "leaderd_backend_request_seconds",
            "Duration of backend requests (wait-for-change excluded), by operation.",
            ["backend", "operation"],
            buckets=REQUEST_BUCKETS,
            registry=self.registry,
        )
        Info("leaderd_build", "The running leaderd build.", registry=self.registry).info(
            {"version": version}
        )
        self._watched: set[int] = set()
        self._connections: ConnectionCollector | None = None

    def wrap(self, backend: Backend) -> MeteredBackend:
        """The backend, timed and counted; give this one to the elections."""
        return MeteredBackend(backend, self)

    def watch(self, node: Node) -> None:
        """Export the node's elections: gauges at scrape time, transitions as they happen."""
        if id(node) in self._watched:
            return
        self._watched.add(id(node))
        for election in node.elections.values():
            self._count_transitions(election)
        self.registry.register(ElectionCollector(node))
        if len(self._watched) == 1:
            # Collected after the gauges, whose status() calls may publish a transition:
            # a scrape that shows is_leader 0 for the first time also counts its step-down.
            self.registry.register(self.transitions)

    def watch_connections(self, connections: Connections) -> None:
        """Export one listener's connection counts (read at scrape time)."""
        if self._connections is None:
            self._connections = ConnectionCollector()
            self.registry.register(self._connections)
        self._connections.listeners.append(connections)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric in the registry."""
        return generate_latest(self.registry)

    def _count_transitions(self, election: Election) -> None:
        counter = self.transitions.labels(election.name)
        counter.inc(0)  # exported as 0 from the start, so rate() and increase() see it
        leading = election.status().is_leader

        def on_change(status: ElectionStatus) -> None:
            nonlocal leading
            if status.is_leader != leading:
                leading = status.is_leader
                counter.inc()

        election.add_listener(on_change)


class ElectionCollector(Collector):
    """Reads every election of a node at scrape time; nothing is cached between scrapes."""

    def __init__(self, node: Node) -> None:
        self._node = node

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        for name, election in self._node.elections.items():
            status = election.status()
            families[0].add_metric([name], 1.0 if status.is_leader else 0.0)
            families[1].add_metric([name], float(status.term))
            families[2].add_metric([name], max(0.0, status.valid_for or 0.0))
            families[3].add_metric([name], float(election.watchers))
            families[4].add_metric([name], float(election.duplicates_seen))
            families[5].add_metric([name], float(election.terms_refused))
            for state, count in election.members().by_state().items():
                families[6].add_metric([name, state], float(count))
        yield from families

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily | CounterMetricFamily, ...]:
        labels = ["election"]
        return (
            GaugeMetricFamily(
                "leaderd_is_leader", "1 if this node leads the election now, else 0.", labels=labels
            ),
            GaugeMetricFamily(
                "leaderd_term", "The election's last known term (fencing token).", labels=labels
            ),
            GaugeMetricFamily(
                "leaderd_lease_valid_seconds",
                "Seconds left before this node's self-fence deadline; 0 unless it leads.",
                labels=labels,
            ),
            GaugeMetricFamily(
                "leaderd_watchers",
                "Clients waiting on /watch (long polls and streams).",
                labels=labels,
            ),
            CounterMetricFamily(
                "leaderd_duplicate_node_id",
                "Other processes seen holding the lease under this daemon's node id.",
                labels=labels,
            ),
            CounterMetricFamily(
                "leaderd_terms_refused",
                "Acquisitions refused: the backend granted a term at or below one already seen.",
                labels=labels,
            ),
            GaugeMetricFamily(
                "leaderd_members",
                "Members of the election as this node last heard them, by state: leader, "
                "standby (healthy), conflict (a duplicate node id), stale.",
                labels=["election", "state"],
            ),
        )


class ConnectionCollector(Collector):
    """The API listeners' connections: open now, refused, timed out, malformed requests."""

    def __init__(self) -> None:
        self.listeners: list[Connections] = []

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        open_, rejected, timed_out, bad = self._families()
        for c in self.listeners:
            open_.add_metric([c.listener], float(c.open))
            for reason, count in c.rejected.items():
                rejected.add_metric([c.listener, reason], float(count))
            for timeout, count in c.timed_out.items():
                timed_out.add_metric([c.listener, timeout], float(count))
            bad.add_metric([c.listener], float(c.bad_requests))
        yield from (open_, rejected, timed_out, bad)

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily, CounterMetricFamily, CounterMetricFamily, CounterMetricFamily
    ]:
        return (
            GaugeMetricFamily(
                "leaderd_http_connections",
                "Open connections to the API (long polls and streams included), by listener.",
                labels=["listener"],
            ),
            CounterMetricFamily(
                "leaderd_http_connections_rejected",
                "Connections answered 503 too_many_connections: over max_connections, or "
                "over what the open-file limit leaves (open_files).",
                labels=["listener", "reason"],
            ),
            CounterMetricFamily(
                "leaderd_http_connections_timed_out",
                "Connections closed for sending no complete request headers within "
                "header_timeout (header), or idle for keepalive_timeout (idle).",
                labels=["listener", "timeout"],
            ),
            CounterMetricFamily(
                "leaderd_http_bad_requests",
                "Malformed HTTP requests answered 400 (logged one line at a time).",
                labels=["listener"],
            ),
        )


class MeteredBackend(Backend):
    """Any backend, with each request timed and each BackendError counted.

    Answers and exceptions pass through unchanged. Only the Backend interface is there:
    a backend's own helpers are read on the backend itself.
    """

    def __init__(self, inner: Backend, metrics: Metrics) -> None:
        self.inner = inner
        self._errors = metrics.backend_errors
        self.kind = kind = inner.kind
        self.capabilities = inner.capabilities
        self._seconds = {
            op: metrics.backend_request_seconds.labels(kind, op)
            for op in ("open", "observe", "acquire_or_renew", "release", "history")
        }
        for error in _error_kinds(BackendError):
            # Exported as 0 from the start: increase() cannot see a series' first sample.
            self._errors.labels(kind, error.__name__)

    def ttl_rule_only(self) -> None:
        self.inner.ttl_rule_only()

    @classmethod
    def from_url(cls, url: str) -> Backend:
        raise TypeError("MeteredBackend wraps a built backend: use Metrics.wrap(backend)")

    @property
    def description(self) -> str:
        return self.inner.description

    async def open(self, elections: Sequence[str]) -> None:
        await self._timed("open", self.inner.open(elections))

    async def observe(
        self, election: str, candidate: Candidate | None = None, ttl: float = 0.0
    ) -> Lease:
        return await self._timed("observe", self.inner.observe(election, candidate, ttl))

    async def acquire_or_renew(self, ask: Ask) -> Lease:
        return await self._timed("acquire_or_renew", self.inner.acquire_or_renew(ask))

    async def release(self, release: Release) -> None:
        await self._timed("release", self.inner.release(release))

    async def history(self, election: str, limit: int) -> list[Tenure]:
        return await self._timed("history", self.inner.history(election, limit))

    async def wait_for_change(self, election: str, timeout: float) -> Grant | None:
        # Waiting is not a request: not timed, but a failure is still a backend error.
        return await self._counted(self.inner.wait_for_change(election, timeout))

    async def close(self) -> None:
        await self.inner.close()

    async def _timed(self, operation: str, request: Awaitable[T]) -> T:
        start = boottime()
        try:
            return await self._counted(request)
        finally:
            self._seconds[operation].observe(boottime() - start)

    async def _counted(self, request: Awaitable[T]) -> T:
        try:
            return await request
        except BackendError as exc:
            self._errors.labels(self.kind, type(exc).__name__).inc()
            raise


def _error_kinds(base: type[BackendError]) -> list[type[BackendError]]:
    """Every subclass of ``base`` (BackendUnavailable, BackendFatal, LeaseLost, ...)."""
    kinds = []
    for kind in base.__subclasses__():
        kinds += [kind, *_error_kinds(kind)]
    return kinds
