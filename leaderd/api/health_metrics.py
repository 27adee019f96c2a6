"""The health checks' metrics (docs/metrics.md), read from health.py at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..supervision.health import Health


class HealthCollector(Collector):
    """Each check's results, last duration, consecutive failures and health."""

    def __init__(self, health: Health) -> None:
        self._health = health

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        results, seconds, failures, healthy = self._families()
        for check in self._health.checks.values():
            label = [check.spec.target]
            for passed, count in check.results.items():
                results.add_metric([*label, "success" if passed else "failure"], float(count))
            seconds.add_metric(label, check.duration)
            failures.add_metric(label, float(check.consecutive_failures))
            healthy.add_metric(label, 1.0 if check.healthy else 0.0)
        yield from (results, seconds, failures, healthy)

    @staticmethod
    def _families() -> tuple[CounterMetricFamily, GaugeMetricFamily, GaugeMetricFamily,
                             GaugeMetricFamily]:  # fmt: skip
        return (
            CounterMetricFamily(
                "leaderd_check_results", "Runs of each health check, by result.",
                labels=["check", "result"],
            ),
            GaugeMetricFamily(
                "leaderd_check_duration_seconds", "How long the check's last run took.",
                labels=["check"],
            ),
            GaugeMetricFamily(
                "leaderd_check_consecutive_failures",
                "Failures of the check in a row (its failure threshold makes it unhealthy).",
                labels=["check"],
            ),
            GaugeMetricFamily(
                "leaderd_check_healthy",
                "1 while the check is healthy (its success threshold met), else 0.",
                labels=["check"],
            ),
        )  # fmt: skip
