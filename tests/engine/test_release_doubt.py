"""A release whose outcome is unknown (docs/algorithm.md, "A release in doubt"): it may
still land later, so this process never leads on its term again; it releases again,
conditioned on the version it was last answered, and leads only with a new term."""

from __future__ import annotations

import asyncio
import dataclasses

from leaderd.backends.base import Candidate, Lease
from leaderd.election.engine import Election
from leaderd.election.release_doubt import version_of
from leaderd.election.state import ElectionState
from leaderd.election.status import ElectionStatus, Role

from .clocks import RealClock
from .fakes import LeaseStore, RecordingBackend
from .test_grant import SLOW_POLL
from .test_rules import ME, T, X, free, held
from .world import FAST, A, B, until


def resigned_in_doubt() -> tuple[ElectionState, float]:
    """node-a led term 1, resigned, and its release of term 1 gave no answer."""
    s, t = ElectionState("default", ME, T, jitter=lambda: 0.0), 100.0
    s.on_lease(held(ME, 1), s.request(t), t, t)
    s.resign(t, 0.0)
    assert s.term_to_release() == 1
    s.in_doubt.on_unknown(1)
    return s, t


def test_after_a_release_in_doubt_the_node_only_observes_while_the_term_is_its_own() -> None:
    s, t = resigned_in_doubt()
    request = s.request(t)
    assert not request.campaigning  # an observe: a renewal would keep the term alive
    s.on_lease(held(ME, 1, version="2"), request, t, t)
    assert s.view(t).role is not Role.LEADER
    assert s.release_due == 1  # release again
    assert version_of(s.lease, ME, 1) == "2"  # on the version this answer carried


def test_an_answer_showing_the_term_in_doubt_held_is_not_led_on_even_when_campaigning() -> None:
    s, t = resigned_in_doubt()
    campaign = dataclasses.replace(s.request(t), campaigning=True)  # a renewal sent anyway
    s.on_lease(held(ME, 1), campaign, t, t)
    assert s.view(t).role is not Role.LEADER and s.held_term is None


def test_the_doubt_ends_once_an_answer_shows_the_term_over() -> None:
    for over in (free(1), held(X, 2), held(ME, 2)):
        s, t = resigned_in_doubt()
        s.on_lease(over, s.request(t), t, t)
        assert s.in_doubt.term is None
        assert s.request(t).campaigning and s.request(t).ask.min_term == over.term + 1


def test_an_expired_looking_answer_naming_the_term_keeps_the_doubt_and_releases_again() -> None:
    """etcd reads a live lease with under a second left as 0 s: were that the term's end, a
    keepalive would renew the very term a late release still matches (found by the model
    check, tests/model, seed 6)."""
    s, t = resigned_in_doubt()
    s.on_lease(held(ME, 1, expires_in=0.0), s.request(t), t, t)
    assert s.in_doubt.term == 1 and not s.request(t).campaigning
    assert s.release_due == 1  # released again, so a lone node is not stranded


def test_a_new_term_is_led_on_after_the_doubt_ended() -> None:
    s, t = resigned_in_doubt()
    s.on_lease(free(1), s.request(t), t, t)
    s.on_lease(held(ME, 2), s.request(t), t, t)
    assert (s.view(t).role, s.view(t).term) == (Role.LEADER, 2)


def test_a_grant_of_a_new_term_ends_the_doubt_and_its_renewals_campaign() -> None:
    s, t = resigned_in_doubt()
    assert s.on_grant(held(ME, 2), t, t) is True
    assert s.in_doubt.term is None and s.request(t).campaigning
    s.on_lease(held(ME, 2), s.request(t), t, t)
    assert (s.view(t).role, s.view(t).term) == (Role.LEADER, 2)


def test_a_release_names_the_version_of_the_last_answer_that_showed_the_term_ours() -> None:
    mine = Lease("default", "node-a", "", 3, None, 5.0, ME.instance, "9")
    assert version_of(mine, ME, 3) == "9"
    assert version_of(mine, ME, 2) == ""  # another term: no version known
    assert version_of(mine, Candidate("node-a"), 3) == ""  # another instance
    assert version_of(None, ME, 3) == ""


async def test_a_release_that_lands_after_the_next_round_leaves_one_leader() -> None:
    """The release of term 1 is held past renew_interval, then lands and grants the lease to
    node-b. Had node-a renewed term 1 and led in between, both would lead."""
    store = LeaseStore(RealClock())
    a_backend = RecordingBackend(store, granting=True)
    a = Election("default", A, FAST, a_backend, clock=RealClock(), jitter=lambda: 0.0)
    b_backend = RecordingBackend(store, granting=True)
    b = Election("default", B, SLOW_POLL, b_backend, clock=RealClock(), jitter=lambda: 0.0)
    told: list[ElectionStatus] = []
    a.add_listener(told.append)
    tasks = [asyncio.create_task(a.run())]
    await until(lambda: a.status().is_leader)
    tasks.append(asyncio.create_task(b.run()))
    await until(lambda: b.status().leader is not None)
    version = store.lease("default").version
    lands_at = store.clock.now() + 3 * FAST.renew_interval
    a_backend.script.release_lands_at = lands_at
    resigned_at = len(told)
    a.resign(0.0)
    await until(lambda: store.clock.now() > lands_at and store.lease("default").term > 1)
    await until(lambda: a.status().is_leader or b.status().is_leader)
    after = told[resigned_at:]
    assert not [s for s in after if s.is_leader and s.term == 1], "led again on term 1"
    assert not (a.status().is_leader and b.status().is_leader)
    assert a_backend.release_versions[0] == version
    for election in (a, b):
        election.stop()
    await asyncio.gather(*tasks)
