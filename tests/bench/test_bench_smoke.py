"""A very small run of every benchmark family, so a broken bench fails CI.

Timing is not judged here (the machine may be busy): only that each family ran, on a real
backend, and produced numbers in a sane range. The full run is `python -m bench`.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.daemons import REPO

# Each run has its own 120 s timeout; a busy machine needs both it and the checks.
pytestmark = [pytest.mark.bench, pytest.mark.timeout(300)]

TINY = [
    "--handovers", "2", "--failovers", "1",
    "--leader-connections", "2", "--leader-duration", "0.5", "--leader-rounds", "1",
    "--client-processes", "1",
    "--watchers", "100", "--watch-trials", "1",
    "--qps-warmup", "0.2", "--qps-window", "1", "--rss-settle", "0.5", "--startup-runs", "1",
]  # fmt: skip


def run_bench(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *TINY, *args, "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    print(proc.stdout)
    report: dict[str, Any] = orjson.loads(out.read_bytes())
    return report


def figure(report: dict[str, Any], backend: str, name: str) -> float:
    found = [f for f in report["figures"] if f["backend"] == backend and f["name"] == name]
    assert len(found) == 1, f"no single figure {backend} {name!r} in {report['figures']}"
    value = found[0]["value"]
    assert value is not None and not math.isnan(value), found[0]
    return float(value)


def test_every_family_runs(tmp_path: Path) -> None:
    # SQLite and the PostgreSQL lease keep it short; the advisory lock differs only by URL
    # (its standbys that lose the race name the new leader only after a round, ~5 s).
    # etcd's hand-over beside etcdctl's, on one cluster: the ratios of the same run.
    with_etcd = shutil.which("etcd") is not None and shutil.which("etcdctl") is not None
    backends = "sqlite,postgresql" + (",etcd" if with_etcd else "")
    report = run_bench(tmp_path, "--backends", backends, "--only",
                       "handover,failover,leader,watch,rss,qps")  # fmt: skip
    assert not report["failed"]
    if with_etcd:
        assert_handover_ratios(report)
    assert not [f for f in report["figures"] if f["family"] == "skip"], "PostgreSQL missing"
    for backend in ("sqlite", "postgresql"):
        assert 0 < figure(report, backend, "graceful handover p99") < 10_000  # ms
        assert 0 < figure(report, backend, "crash failover p99") < 10_000
        assert 0 <= figure(report, backend, "backend queries/s, leader") < 100
        assert 0 <= figure(report, backend, "backend queries/s, follower") < 100
    # Ratios to bare aiohttp measured in the same run (no timing judged: only that both ran).
    assert figure(report, "any", "/leader 2 conns: req/s vs aiohttp") > 0
    level = report["data"]["leader"]["levels"][0]
    assert [w["statuses"] for w in level["leaderd"]] == [
        {"200": w["requests"]} for w in level["leaderd"]
    ]
    assert all(w["requests"] > 0 for w in level["aiohttp"])
    assert figure(report, "any", "backend queries per /leader request") < 0.01
    assert figure(report, "any", "/watch fan-out 100: all answered vs aiohttp") > 0
    assert 5 < figure(report, "sqlite", "RSS idle") < 1000  # MB
    for trials in ("sizes", "floor"):
        trial = report["data"]["watch"][trials]["100"][0]
        assert trial["answered"] == 100 and trial["statuses"] == [{"200": 100}]


@pytest.mark.skipif(
    shutil.which("etcd") is None or shutil.which("etcdctl") is None,
    reason="etcd is not installed (apt-get install -y etcd-server etcd-client); "
    "the etcd comparison is optional",
)
def test_etcd_comparison_runs(tmp_path: Path) -> None:
    report = run_bench(tmp_path, "--only", "etcd")
    assert not report["failed"]
    where = "etcd x3 (no fsync)"
    for name in ("etcdctl elect graceful handover p99", "  leaderd graceful handover p99"):
        assert 0 < figure(report, where, name) < 10_000  # ms
    for name in ("etcd lease crash failover p99", "  leaderd crash failover p99"):
        assert 0 < figure(report, where, name) < 10_000
    for role in ("leader", "follower"):
        assert 0 <= figure(report, "etcd", f"etcd requests/s, {role}") < 100
    assert 5 < figure(report, "etcd", "RSS idle") < 1000  # MB


@pytest.mark.kubernetes
def test_kubernetes_bench_measures_leaderd_and_client_go(tmp_path: Path) -> None:
    """bench/kubernetes.py: one hand-over and one crash failover of each, same control plane."""
    out = tmp_path / "kube.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.kubernetes", "--handovers", "1", "--failovers", "1",
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    report: dict[str, Any] = orjson.loads(out.read_bytes())
    for who in ("leaderd", "client-go"):
        for family in ("handover", "failover"):
            first = report[who][family]["first"]
            assert first["n"] == 1 and 0 < first["p50"] < 60, (who, family, first)


def assert_handover_ratios(report: dict[str, Any]) -> None:
    assert figure(report, "etcdctl (no fsync)", "etcdctl elect graceful handover p99") > 0
    for backend in ("sqlite", "etcd"):
        assert 0 < figure(report, backend, "graceful handover p99") < 10_000  # ms
        assert figure(report, backend, "graceful handover p50 / etcdctl's") > 0
    sqlite = report["data"]["handover sqlite"]
    assert sqlite["first"]["n"] == 2 and sqlite["all"]["n"] == 2
