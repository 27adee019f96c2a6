"""The shipped alerting rules, checked by promtool (Debian's prometheus package).

`promtool test rules` replays series as Prometheus stores them: one sample per scrape of
each daemon, each daemon scraped every 15 s at its own offset. The handovers below are
ordinary ones whose scrapes fall badly (the instant sum of leaderd_is_leader is 2, or 0,
for a while): the alerts must stay silent at every evaluation. A real overlap of two
leaders and a real absence of any leader must fire. The same scenarios run against the
naive rules too, which must fail them: the scenarios are not toothless.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ._tools import ROOT, require, run

pytestmark = pytest.mark.deploy

RULES = ROOT / "packaging" / "prometheus" / "leaderd.rules.yml"
STEP = 5  # seconds between input samples (and between rule evaluations)
SCRAPE = 15  # each daemon's scrape interval
END = 600  # seconds of series


@dataclass
class Daemon:
    """One daemon as Prometheus sees it: scraped at `offset` + k * SCRAPE."""

    name: str
    offset: int
    leads: Callable[[int], bool]
    alive: Callable[[int], bool] = lambda t: True

    def series(self) -> list[dict[str, str]]:
        leading, up, was_alive = [], [], True
        for t in range(0, END + 1, STEP):
            if t % SCRAPE != self.offset:
                leading.append("_")
                up.append("_")
                continue
            alive = self.alive(t)
            # A failed scrape writes up 0 and, the first time, a staleness marker.
            leading.append(str(int(self.leads(t))) if alive else "stale" if was_alive else "_")
            up.append(str(int(alive)))
            was_alive = alive
        labels = f'instance="{self.name}:4040", job="leaderd"'
        return [
            {"series": f'leaderd_is_leader{{election="default", {labels}}}',
             "values": " ".join(leading)},
            {"series": f"up{{{labels}}}", "values": " ".join(up)},
        ]  # fmt: skip


def before(t0: int) -> Callable[[int], bool]:
    return lambda t: t < t0


def since(t0: int) -> Callable[[int], bool]:
    return lambda t: t >= t0


def never(t: int) -> bool:
    return False


# Ordinary life: the alerts must not fire at any evaluation. `sum` is what the instant sum
# of leaderd_is_leader shows at `at` seconds: the skew a naive rule trips over.
ORDINARY: dict[str, tuple[list[Daemon], int, int]] = {
    "handover, the old leader scraped last before it and the new one first after": (
        [Daemon("a", 0, before(20)), Daemon("b", 10, since(20)), Daemon("c", 5, never)], 27, 2),
    "handover, the new leader scraped last before it and the old one first after": (
        [Daemon("a", 0, before(12)), Daemon("b", 10, since(12)), Daemon("c", 5, never)], 20, 0),
    "the leader is stopped, hands over, and comes back as a follower 20 s later": (
        [Daemon("a", 0, before(20), alive=lambda t: not 20 <= t < 40),
         Daemon("b", 10, since(20)), Daemon("c", 5, never)], 27, 2),
    "the leader crashes; a standby takes over after ttl + retry_interval (17 s)": (
        [Daemon("a", 0, before(20), alive=before(20)), Daemon("b", 10, since(37)),
         Daemon("c", 5, never)], 35, 0),
}  # fmt: skip

# Real problems, and when each alert must (and must not yet) fire.
PROBLEMS: dict[str, tuple[list[Daemon], str, int, int]] = {
    "two daemons lead at once from 60 s on": (
        [Daemon("a", 0, since(0)), Daemon("b", 10, since(60)), Daemon("c", 5, never)],
        "LeaderdTwoLeaders", 90, 150),
    "nobody leads from 60 s on (the database is down)": (
        [Daemon("a", 0, before(60)), Daemon("b", 10, never), Daemon("c", 5, never)],
        "LeaderdNoLeader", 150, 210),
}  # fmt: skip

SUMMARY = {
    "LeaderdTwoLeaders": "election default has 2 leaders",
    "LeaderdNoLeader": "election default has had no leader for 2 minutes",
}


def alert_checks(name: str, at: int, firing: bool) -> dict[str, Any]:
    expected = [{"exp_labels": {"severity": "page", "election": "default"},
                 "exp_annotations": {"summary": SUMMARY[name]}}] if firing else []  # fmt: skip
    return {"eval_time": f"{at}s", "alertname": name, "exp_alerts": expected}


def unit_tests(rules: Path) -> dict[str, Any]:
    tests = []
    for title, (daemons, at, total) in ORDINARY.items():
        checks = [alert_checks(name, t, False) for t in range(0, END + 1, STEP)
                  for name in SUMMARY]  # fmt: skip
        shown = {"expr": "sum by (election) (leaderd_is_leader)", "eval_time": f"{at}s",
                 "exp_samples": [{"labels": '{election="default"}', "value": total}]}  # fmt: skip
        tests.append(scenario(title, daemons, checks, [shown]))
    for title, (daemons, name, quiet, fired) in PROBLEMS.items():
        checks = [alert_checks(name, quiet, False), alert_checks(name, fired, True),
                  alert_checks(name, END, True)]  # fmt: skip
        tests.append(scenario(title, daemons, checks, []))
    return {"rule_files": [str(rules)], "evaluation_interval": f"{STEP}s", "tests": tests}


def scenario(title: str, daemons: list[Daemon], alerts: list[Any], exprs: list[Any]) -> Any:
    return {
        "name": title,
        "interval": f"{STEP}s",
        "input_series": [s for d in daemons for s in d.series()],
        "alert_rule_test": alerts,
        "promql_expr_test": exprs,
    }


def promtool_test(rules: Path, tmp_path: Path) -> Any:
    tests = tmp_path / "leaderd.rules.test.yml"
    tests.write_text(json.dumps(unit_tests(rules), indent=1))  # JSON is YAML
    return run([require("promtool"), "test", "rules", tests], check=False)


def test_promtool_checks_the_rules() -> None:
    done = run([require("promtool"), "check", "rules", RULES])
    assert "SUCCESS: 9 rules found" in done.stdout, done.stdout


def test_alerts_stay_silent_on_handovers_and_fire_on_real_problems(tmp_path: Path) -> None:
    done = promtool_test(RULES, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_naive_rules_fail_the_same_scenarios(tmp_path: Path) -> None:
    """The instant sum fires on skewed handovers: what the shipped rules avoid."""
    naive = tmp_path / "naive.rules.yml"
    rules = [
        {"alert": name, "expr": f"sum by (election) (leaderd_is_leader) {cmp}",
         "labels": {"severity": "page"}, "annotations": {"summary": SUMMARY[name]}}
        for name, cmp in (("LeaderdNoLeader", "== 0"), ("LeaderdTwoLeaders", "> 1"))
    ]  # fmt: skip
    naive.write_text(json.dumps({"groups": [{"name": "naive", "rules": rules}]}))
    done = promtool_test(naive, tmp_path)
    assert done.returncode != 0, done.stdout
    for title in ORDINARY:  # each ordinary scenario trips a naive rule
        assert f"name: {title}," in done.stdout + done.stderr, done.stdout + done.stderr


def standby_series(name: str, offset: int, leads: Callable[[int], bool], standbys: Any) -> Any:
    """A daemon's leaderd_is_leader and leaderd_members{state="standby"}, scraped every
    SCRAPE seconds from ``offset``; ``standbys(t)``: the healthy standbys it sees at t."""
    labels = f'election="default", instance="{name}:4040", job="leaderd"'
    times = range(0, END + 1, STEP)
    at = [t % SCRAPE == offset for t in times]
    leading = [str(int(leads(t))) if s else "_" for t, s in zip(times, at, strict=True)]
    seen = [str(standbys(t)) if s else "_" for t, s in zip(times, at, strict=True)]
    return [
        {"series": f"leaderd_is_leader{{{labels}}}", "values": " ".join(leading)},
        {"series": f'leaderd_members{{{labels}, state="standby"}}', "values": " ".join(seen)},
    ]


def no_standby_check(at: int, firing: bool) -> dict[str, Any]:
    labels = {"severity": "warning", "election": "default", "instance": "a:4040",
              "job": "leaderd", "state": "standby"}  # fmt: skip
    summary = "a:4040 leads election default with no healthy standby"
    expected = [{"exp_labels": labels, "exp_annotations": {"summary": summary}}]
    return {"eval_time": f"{at}s", "alertname": "LeaderdNoHealthyStandby",
            "exp_alerts": expected if firing else []}  # fmt: skip


def test_no_healthy_standby_fires_for_a_lonely_leader_only(tmp_path: Path) -> None:
    """The leader sees its two standbys go (at 60 s, at 120 s): the alert fires once it has
    seen none for a minute and 5 more. A follower that sees none, and a new leader whose
    first scrapes count no standby yet (a handover at 500 s), do not fire it."""
    lonely = standby_series("a", 0, lambda t: t < 500, lambda t: 2 if t < 60 else int(t < 120))
    handover = standby_series("b", 10, lambda t: t >= 500, lambda t: int(t >= 520))
    series = lonely + handover
    checks = [no_standby_check(t, False) for t in (100, 240, 460)]
    checks += [no_standby_check(t, True) for t in (490, 500)]
    quiet_b = {"eval_time": f"{END}s", "alertname": "LeaderdNoHealthyStandby", "exp_alerts": []}
    test = {"name": "no healthy standby", "interval": f"{STEP}s", "input_series": series,
            "alert_rule_test": [*checks, quiet_b]}  # fmt: skip
    path = tmp_path / "standby.test.yml"
    path.write_text(json.dumps({"rule_files": [str(RULES)], "evaluation_interval": f"{STEP}s",
                                "tests": [test]}))  # fmt: skip
    done = run([require("promtool"), "test", "rules", path], check=False)
    assert done.returncode == 0, done.stdout + done.stderr


JOB_PERIOD = 60
JOB_SUMMARY = "the run --once-per job of election default has not succeeded for two periods"


def job_series(name: str, offset: int, successes: Callable[[int], int | None]) -> Any:
    """A daemon's job gauges scraped every SCRAPE s from ``offset``: the period, the first
    start (0) and ``successes(t)``, the last success it read by t (None: never)."""
    labels = f'election="default", instance="{name}:4040", job="leaderd"'
    times = [t for t in range(0, END + 1, STEP)]

    def values(value: Callable[[int], int | None]) -> str:
        shown = [value(t) if t % SCRAPE == offset else None for t in times]
        return " ".join("_" if v is None else str(v) for v in shown)

    return [
        {"series": f"leaderd_job_period_seconds{{{labels}}}",
         "values": values(lambda t: JOB_PERIOD)},
        {"series": f"leaderd_job_first_start_timestamp_seconds{{{labels}}}",
         "values": values(lambda t: 0)},
        {"series": f"leaderd_job_last_success_timestamp_seconds{{{labels}}}",
         "values": values(successes)},
    ]  # fmt: skip


def job_check(at: int, firing: bool) -> dict[str, Any]:
    expected = [{"exp_labels": {"severity": "warning", "election": "default"},
                 "exp_annotations": {"summary": JOB_SUMMARY}}]  # fmt: skip
    return {"eval_time": f"{at}s", "alertname": "LeaderdJobNotSucceeding",
            "exp_alerts": expected if firing else []}  # fmt: skip


def succeeded_every_period(until: int, lag: int = 0) -> Callable[[int], int | None]:
    """The last success as a daemon reads it ``lag`` s late: one run a period, until ``until``."""
    return lambda t: min(max(t - lag, 0), until) // JOB_PERIOD * JOB_PERIOD + 1


def test_a_job_alert_fires_after_two_periods_without_success_only(tmp_path: Path) -> None:
    """Succeeding every period (the follower reading the record 30 s late): silent. Failing
    from 120 s on: fires once its last success (121 s) is two periods old, not before. Never
    succeeded since its first start at 0: fires after two periods."""
    ok = job_series("a", 0, succeeded_every_period(END)) + job_series(
        "b", 10, succeeded_every_period(END, lag=30)
    )
    failing = job_series("a", 0, succeeded_every_period(120))
    never = job_series("a", 0, lambda t: None)
    tests = [
        {"name": "succeeding", "interval": f"{STEP}s", "input_series": ok,
         "alert_rule_test": [job_check(t, False) for t in range(0, END + 1, 30)]},
        {"name": "failing", "interval": f"{STEP}s", "input_series": failing,
         "alert_rule_test": [job_check(235, False), job_check(250, True), job_check(END, True)]},
        {"name": "never", "interval": f"{STEP}s", "input_series": never,
         "alert_rule_test": [job_check(115, False), job_check(130, True)]},
    ]  # fmt: skip
    spec = tmp_path / "jobs.test.yml"
    spec.write_text(json.dumps({"rule_files": [str(RULES)], "evaluation_interval": f"{STEP}s",
                                "tests": tests}))  # fmt: skip
    done = run([require("promtool"), "test", "rules", spec], check=False)
    assert done.returncode == 0, done.stdout + done.stderr
