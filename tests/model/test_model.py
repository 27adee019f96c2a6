"""The model check of the protocol (tests/model): the real engine, and the real etcd backend,
against in-memory models of the backends on virtual time, every step checked.

The named cases walk the paths of faults found by review (issue 24); they are expected to
fail until their fixes land, and strict: once a fix lands, the case passes, the test fails,
and the merger removes the marker (and the path's exclusion from the exploration).
"""

from __future__ import annotations

import dataclasses

import pytest

from leaderd.backends.etcd.backend import EtcdBackend
from leaderd.election.state import ElectionState

from . import cases
from .checker import Violation
from .etcdclient import EtcdWorld
from .explore import WORLDS, exploration
from .network import FAULTS
from .scheduler import Plan, run

pytestmark = pytest.mark.model

STEPS = 30_000  # per world: 60,000 steps a CI run


@pytest.mark.parametrize("world", ["row", "etcd"])
def test_exploration(world: str) -> None:
    report = exploration(world, seed=1, steps=STEPS)
    assert report.steps >= STEPS
    # Not vacuous: leadership changed hands many times under the faults.
    assert report.leaderships >= 20 and report.top_term >= 20, report


def test_a_deadline_past_the_lease_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker is not blind: an engine that leads one second past its deadline is
    caught."""
    honest = ElectionState._deadline_after
    monkeypatch.setattr(
        ElectionState, "_deadline_after", lambda self, t, lease: honest(self, t, lease) + 1.0
    )
    with pytest.raises(Violation):
        exploration("row", seed=1, steps=STEPS)


def test_finding_1_cached_heartbeat() -> None:
    """A grant of a spare kept alive by a round that failed, after an answer from the cache:
    led on only from a request's own answer (failed before rule 10's fix: the heir led
    past its spare's expiry)."""
    run(cases.cached_heartbeat())


def test_finding_1_cached_heartbeat_on_a_row() -> None:
    """The engine's part alone: a cached answer's heartbeat is not filed under a later send
    time (failed before the fix)."""
    run(cases.cached_heartbeat_row())


def test_finding_2_suspended_spare() -> None:
    """A spare etcd expired during a host suspend is not reported fresh (failed while the
    spare aged on CLOCK_MONOTONIC)."""
    run(cases.suspended_spare())


def test_finding_2_control_a_pause_without_suspend() -> None:
    """The same path with CLOCK_MONOTONIC running on: the spare is kept alive, no fault."""
    run(cases.suspended_spare(suspend=False))


@pytest.mark.parametrize("to", [True, False], ids=["reserved", "granted"])
@pytest.mark.parametrize("world", ["row", "etcd"])
def test_finding_4_late_release(world: str, to: bool) -> None:
    """A release held until after its sender renewed the same term changes nothing (failed on
    main before the release-in-doubt rule: the lease went to another node while its sender
    led)."""
    run(cases.late_release(to, WORLDS[world]))


@pytest.mark.parametrize("to", [True, False], ids=["reserved", "granted"])
@pytest.mark.parametrize("world", ["row", "etcd"])
def test_finding_4_control_release_applied_on_time(world: str, to: bool) -> None:
    """The same path with the release applied at once and its answer lost: no fault."""
    run(cases.late_release(to, WORLDS[world], fate="lose_answer"))


def test_etcd_exploration_seed_6() -> None:
    """Found by this model after the release-in-doubt rule landed: on etcd an observe whose
    timetolive reads a live lease as 0 s (whole seconds, rounded down) ended the doubt; the
    process renewed the same term and led, and its held grant, conditioned on a mod revision
    that keepalives keep, then applied. The schedule that found it: seed 6 with neither
    suspends nor cached answers."""
    faults = dataclasses.replace(FAULTS, stalled_release=0.25, cache=0)
    run(Plan(EtcdWorld, 6, 50_000, faults, suspends=False))


def test_the_etcd_world_runs_the_real_backend() -> None:
    assert issubclass(EtcdWorld.Backend, EtcdBackend)
