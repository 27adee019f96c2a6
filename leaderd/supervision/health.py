"""Whether the application beside leaderd is healthy, as its checks say (checks.py):
each check runs every interval, and turns unhealthy after ``failures`` consecutive
failures and healthy again after ``successes`` consecutive successes, so a flapping check
cannot move leadership faster than its thresholds allow (docs/operations.md, "Health checks").

A node starts "not yet healthy": it campaigns only once every check of the election passed
(``successes`` times), so a node whose application never came up never leads. Failures
within ``grace`` of the start are not counted (a slow start): the check stays "starting".
Times are read from clock.py (rule 11): a result gates a claim.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..clock import boottime
from .checks import CheckSpec, Probe, Result, probe_of

log = logging.getLogger("leaderd.health")

OnChange = Callable[[], None]


@dataclass
class CheckState:
    """One check's running record."""

    spec: CheckSpec
    probe: Probe
    started_at: float = field(default_factory=boottime)
    healthy: bool = False
    decided: bool = False  # a threshold was crossed once: "starting" until then
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    results: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    output: str = "not run yet"
    duration: float = 0.0

    def record(self, result: Result, duration: float, now: float) -> bool:
        """Count one result; True when the check's state (healthy, unhealthy) changed."""
        self.results[result.healthy] += 1
        self.output, self.duration = result.output, duration
        before = self.state
        if result.healthy:
            self.consecutive_failures = 0
            self.consecutive_successes += 1
        else:
            self.consecutive_successes = 0
            counted = now - self.started_at >= self.spec.grace
            self.consecutive_failures += 1 if counted else 0
        if self.consecutive_successes >= self.spec.successes:
            self.healthy = self.decided = True
        elif self.consecutive_failures >= self.spec.failures:
            self.healthy, self.decided = False, True
        return self.state != before

    @property
    def state(self) -> str:
        return "healthy" if self.healthy else ("unhealthy" if self.decided else "starting")

    @property
    def why(self) -> str:
        """Why it is not healthy: "CHECK: last output" (members, history, /status)."""
        return f"{self.spec.target}: {self.output}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.spec.target,
            "healthy": self.healthy,
            "state": self.state,
            "output": self.output,
            "consecutive_failures": self.consecutive_failures,
            "duration_ms": round(self.duration * 1000, 1),
            "interval_s": self.spec.interval,
        }


class Health:
    """The checks of one daemon, shared by the elections that name them."""

    def __init__(self) -> None:
        self.checks: dict[CheckSpec, CheckState] = {}
        self._of: dict[str, list[CheckState]] = {}
        self._listeners: dict[str, list[OnChange]] = {}

    def attach(
        self, election: str, specs: Sequence[CheckSpec], on_change: OnChange
    ) -> Callable[[], str]:
        """Run ``specs`` for ``election`` (a check named twice runs once), call
        ``on_change`` when one of them changes state; the function that says why the
        election's checks fail ("" while they pass)."""
        states = [self.checks.setdefault(s, CheckState(s, probe_of(s.target))) for s in specs]
        self._of[election] = states
        self._listeners.setdefault(election, []).append(on_change)
        return lambda: self.unhealthy(election)

    def unhealthy(self, election: str) -> str:
        """Empty while every check of ``election`` is healthy; else why the first is not."""
        return next((c.why for c in self._of.get(election, ()) if not c.healthy), "")

    def of(self, election: str) -> list[CheckState]:
        return list(self._of.get(election, ()))

    def describe(self) -> list[dict[str, Any]]:
        """Every check, as GET /status lists them."""
        return [c.to_dict() for c in self.checks.values()]

    async def run(self) -> None:
        """Run every check every interval until cancelled."""
        if self.checks:
            await asyncio.gather(*(self._keep_checking(c) for c in self.checks.values()))

    async def _keep_checking(self, check: CheckState) -> None:
        while True:
            started = boottime()
            result = await check.probe.run(check.spec.timeout)
            now = boottime()
            if check.record(result, now - started, now):
                self._changed(check)
            await asyncio.sleep(max(0.0, started + check.spec.interval - boottime()))

    def _changed(self, check: CheckState) -> None:
        level = logging.INFO if check.healthy else logging.WARNING
        log.log(level, "check %s is %s: %s", check.spec.target, check.state, check.output)
        for election, states in self._of.items():
            if check in states:
                for listener in self._listeners.get(election, ()):
                    listener()
