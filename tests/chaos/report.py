"""The chaos report: JSON for machines, one table for people."""

from __future__ import annotations

from typing import Any


def table(runs: list[dict[str, Any]]) -> str:
    """Faults by kind, failover times and violations per backend, as fixed-width text."""
    head = (
        f"{'backend':<11} {'fault':<13} {'injected':>8} {'on leader':>9} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
    )
    lines = [head, "-" * len(head)]
    for run in runs:
        backend = run["backend"]
        by_target: dict[str, int] = {}
        for f in run["faults"]:
            if f["target_role"] in ("leader", "-"):
                by_target[f["kind"]] = by_target.get(f["kind"], 0) + 1
        for kind, n in run["faults_by_kind"].items():
            stats = run["failover"].get(kind)
            times = (
                f"{stats['p50_ms']:>8.0f} {stats['p99_ms']:>8.0f} {stats['max_ms']:>8.0f}"
                if stats
                else f"{'-':>8} {'-':>8} {'-':>8}"
            )
            lines.append(f"{backend:<11} {kind:<13} {n:>8} {by_target.get(kind, 0):>9} {times}")
        s = run["settings"]
        obs = run["observations"]
        verdict = (
            "OK"
            if run["violations"] == 0
            else "VIOLATIONS " + ", ".join(f"{k}={n}" for k, n in run["violations_by_kind"].items())
        )
        lines.append(
            f"{backend:<11} {'total':<13} {run['faults_injected']:>8}   "
            f"{run['seconds']:.0f}s, ttl {s['ttl']:g}s, bound {s['liveness_bound_s']:g}s, "
            f"{obs['leader_answers']} leader answers, {obs['watch_events']} watch events: "
            f"{verdict}"
        )
        lines.append("")
    return "\n".join(lines)


def violations_text(runs: list[dict[str, Any]], limit: int = 5) -> str:
    """The first few violations of each run, one line each."""
    lines = []
    for run in runs:
        for v in run["violation_details"][:limit]:
            why = v.get("explanation", "")
            lines.append(f"[{run['backend']}] {v['kind']}: {why}")
        if run["workdir"]:
            lines.append(f"[{run['backend']}] daemon logs kept in {run['workdir']}")
    return "\n".join(lines)
