"""Short chaos runs: one deck per backend, every fault kind injected once (the fixed seed's
schedule, capped at CAP seconds), and zero violations.

And the other half of the proof: the same checker, run against a leaderd whose engine
ignores its self-fence deadline, must report violations — a checker that cannot fail
proves nothing. The long run, many decks, is `make chaos` (docs/chaos.md).

`make test` runs the decks two at a time, handed out in the order of this file: the
longest first, so that no long deck starts last and runs on alone.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.chaos.etcd import EtcdChaos
from tests.support.chaos.harness import Chaos, Result
from tests.support.chaos.settings import FAULTS, Settings
from tests.support.pgserver import PgServer

# A deck ends well before this; a run that reaches it has missed a kind, and fails.
CAP = 90.0
# Starting the daemons (and a backend's servers), a deck, and the checks.
TIMEOUT = 240


def run(settings: Settings, pg: PgServer | None = None) -> Result:
    return asyncio.run(Chaos(settings, pg).run())


def summary(result: Result) -> str:
    return f"{result.violations.counts}: {result.violations.listed[:5]} (logs: {result.workdir})"


def assert_every_kind_injected(result: Result) -> None:
    injected = result.injected()
    missing = [kind for kind in FAULTS[result.settings.backend] if not injected.get(kind)]
    assert not missing, f"never injected: {missing} ({injected})"


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
def test_etcd_survives_chaos() -> None:
    # Three daemons on a 3-member etcd cluster of its own; member faults as well
    # (tests/backends/etcd).
    result = asyncio.run(EtcdChaos(Settings(backend="etcd", nodes=3, duration=CAP, decks=1)).run())
    assert_every_kind_injected(result)
    assert result.violations.total == 0, summary(result)


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize(
    "backend", [pytest.param("postgresql", marks=pytest.mark.postgres), "sqlite"]
)
def test_lease_backend_survives_chaos(backend: str) -> None:
    # PostgreSQL: the harness starts its own server, whose clock clock_step moves.
    result = run(Settings(backend=backend, duration=CAP, decks=1))
    assert_every_kind_injected(result)
    assert result.violations.total == 0, summary(result)


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.postgres
def test_advisory_survives_chaos() -> None:
    # takeover=wait (the default) closed the two-leader window after a lost connection
    # that this harness found (docs/chaos.md, "Findings").
    # docs/chaos.md finding 3: rarely a stopped fresh leader's session outlives the ttl
    # by up to ~0.5 s more; liveness gets that much more room here, safety none.
    result = run(Settings(backend="advisory", duration=CAP, decks=1, slack=2.5))
    assert_every_kind_injected(result)
    assert result.violations.total == 0, summary(result)


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
def test_supervised_commands_survive_chaos() -> None:
    """Every daemon runs `run -- tests/chaos/command.py` (a command with a setsid worker): the
    leader's keeper is SIGKILLed, or frozen while its daemon resigns, or frozen with its
    daemon, among daemon kills and freezes. Never two commands at once, none left after the run."""
    kinds = ("keeper_sigkill", "keeper_sigstop", "both_sigstop", "sigkill", "sigstop", "sigterm")
    # Two decks: one moves the command too few times (faults on followers do not).
    result = run(Settings(backend="sqlite", duration=CAP, decks=2, supervise=True, faults=kinds))
    injected = result.injected()
    assert all(injected.get(kind) for kind in kinds), injected
    assert result.extra["commands_started"] >= len(kinds), result.extra
    assert result.violations.total == 0, summary(result)


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
def test_checker_catches_an_engine_that_does_not_self_fence() -> None:
    """SIGSTOP the leader past its ttl: after SIGCONT the unfenced one answers "leader" with
    its old term while another node already leads with a newer one."""
    settings = Settings(
        backend="sqlite", duration=25, unsafe=True, faults=("sigstop",), leader_bias=1.0,
        until_violation=True,
    )  # fmt: skip
    result = run(settings)
    assert result.violations.counts.get("stale_leader", 0) > 0, summary(result)
    stale = next(v for v in result.violations.listed if v["kind"] == "stale_leader")
    assert stale["stale"]["term"] < stale["seen_before"]["term"]
    assert stale["stale"]["node"] != stale["seen_before"]["node"]
