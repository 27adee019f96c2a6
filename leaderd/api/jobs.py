"""What `run --once-per` reports: the `GET /jobs` body, the `leaderd jobs` table and the job
metrics (docs/api.md, docs/metrics.md). All from the record the runner last read: no
request reaches the backend per answer or scrape."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..backends.jobs import JobRecord, RunStatus
from ..supervision.once_per import due_in

if TYPE_CHECKING:
    from ..election.node import Node
    from ..supervision.once_per import OncePer

DURATION_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)


def jobs_body(node: Node, election: str) -> dict[str, Any]:
    """The body of GET /jobs: the election's job, if this daemon runs one."""
    job = node.jobs.get(election)
    return {"election": election, "node_id": node.node_id, "jobs": [job()] if job else []}


def job_body(job: OncePer) -> dict[str, Any]:
    """One job as GET /jobs lists it; times on the backend's clock, RFC 3339."""
    record = job.record
    body: dict[str, Any] = {
        "command": job.command,
        "period_s": job.period,
        "catch_up": job.catch_up,
        "runs": 0,
        "last_start": None,
        "started_by": None,
        "term": None,
        "last_end": None,
        "status": None,
        "exit_code": None,
        "last_success": None,
        "next_due": None,
        "read_at": None,
    }
    if record is None:
        return body
    body.update(_recorded(record))
    body["next_due"] = _iso(record.now + due_in(record, job.period, job.catch_up))
    return body


def _recorded(record: JobRecord) -> dict[str, Any]:
    return {
        "runs": record.runs,
        "last_start": _iso(record.started_at),
        "started_by": record.started_by or None,
        "term": record.term or None,
        "last_end": _iso(record.ended_at),
        "status": record.status.value if record.status else None,
        "exit_code": record.exit_code,
        "last_success": _iso(record.succeeded_at),
        "read_at": _iso(record.now),
    }


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    when = dt.datetime.fromtimestamp(seconds, dt.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JobMetrics(Collector):
    """leaderd_job_*: what this node ran (counted, timed) and what the record says."""

    def __init__(self, registry: CollectorRegistry, election: str, job: OncePer) -> None:
        self.election, self.job = election, job
        self.runs = Counter("leaderd_job_runs", "Job runs this node started, by how they ended.",
                            ["election", "status"], registry=registry)  # fmt: skip
        failed = "Job runs this node started that failed (a status other than 0)."
        self.failures = Counter("leaderd_job_failures", failed, ["election"], registry=registry)
        self.duration = Histogram("leaderd_job_duration_seconds", "How long the job runs this "
                                  "node started took.", ["election"], buckets=DURATION_BUCKETS,
                                  registry=registry)  # fmt: skip
        registry.register(self)

    def ran(self, status: RunStatus, seconds: float) -> None:
        """The runner's hook: one run of this node ended."""
        self.runs.labels(self.election, status.value).inc()
        if status is RunStatus.FAILED:
            self.failures.labels(self.election).inc()
        self.duration.labels(self.election).observe(seconds)

    def collect(self) -> Iterator[Metric]:
        record = self.job.record
        gauges = {
            "leaderd_job_period_seconds": ("The job's period (run --once-per).", self.job.period),
            "leaderd_job_last_success_timestamp_seconds": (
                "When the job's last successful run ended (backend clock), as last read.",
                record.succeeded_at if record else None,
            ),
            "leaderd_job_first_start_timestamp_seconds": (
                "When the job was first started (backend clock), as last read.",
                record.first_started_at if record else None,
            ),
        }
        for name, (documentation, value) in gauges.items():
            gauge = GaugeMetricFamily(name, documentation, labels=["election"])
            if value is not None:
                gauge.add_metric([self.election], value)
            yield gauge


def job_rows(body: dict[str, Any]) -> list[tuple[str, ...]]:
    """The `leaderd jobs` table of a GET /jobs answer."""
    rows: list[tuple[str, ...]] = [
        ("COMMAND", "PERIOD", "LAST START", "BY", "STATUS", "LAST SUCCESS", "NEXT DUE")
    ]
    for j in body["jobs"]:
        status = j["status"] or "never run"
        if j["exit_code"] not in (None, 0):
            status += f" ({j['exit_code']})"
        rows.append((" ".join(j["command"]), f"{j['period_s']:g}s", j["last_start"] or "-",
                     j["started_by"] or "-", status, j["last_success"] or "-",
                     j["next_due"] or "-"))  # fmt: skip
    return rows
