"""Who may lead (leaderd/candidacy.py and its use by ElectionState; docs/algorithm.md,
"Who leads"): a node whose checks fail or that is a witness sends reads and never takes a
lease; a leader whose checks fail keeps renewing and hands over by its on_unhealthy policy,
to the standby of the highest priority, the freshest of those."""

from __future__ import annotations

import dataclasses

import pytest

from leaderd.backends.base import Candidate
from leaderd.backends.records import Member
from leaderd.election.candidacy import Failback, barred, decide, hands_over, heirs, standbys
from leaderd.election.heir import heir_of
from leaderd.election.state import MIN_DELAY

from .test_rules import ME, Node, free, held, leading

SICK = "exec:/bin/app-ok: exit status 1"


def member(node_id: str, priority: int = 1, ago: float = 0.5, **more: object) -> Member:
    values: dict[str, object] = {"campaigning": True, "priority": priority, "health": ""}
    values.update(more)
    return Member(node_id, f"i-{node_id}", "", "", 15.0, None, ago, **values)  # type: ignore[arg-type]


def test_barred_says_why_a_node_may_not_campaign() -> None:
    assert barred(ME) == ""
    assert barred(dataclasses.replace(ME, health=SICK)) == f"unhealthy: {SICK}"
    assert barred(dataclasses.replace(ME, priority=0)) == "priority 0 (a witness: it never leads)"


def test_heirs_are_healthy_fresh_campaigning_others_by_priority_then_freshness() -> None:
    listed = [
        member("b", priority=1, ago=0.1),
        member("c", priority=2, ago=3.0),
        member("d", priority=2, ago=1.0),
        member("sick", priority=9, health=SICK),
        member("witness", priority=0),
        member("resting", priority=9, campaigning=False),
        member("silent", priority=9, ago=7.5),  # half of its 15 s ttl ago
        member(ME.node_id, priority=9),
    ]
    assert [m.node_id for m in heirs(listed, heir_of(ME), elapsed=0.0)] == ["d", "c", "b"]
    # As the answer ages, members heard near the window's edge drop out.
    assert [m.node_id for m in heirs(listed, heir_of(ME), elapsed=5.0)] == ["d", "b"]


@pytest.mark.parametrize(
    ("policy", "health", "standbys", "hands"),
    [
        ("handover", SICK, 1, True),
        ("handover", SICK, 0, False),  # keeps leading: nobody healthy can take over
        ("step-down", SICK, 0, True),
        ("keep", SICK, 1, False),
        ("handover", "", 1, False),  # healthy: nothing to do
    ],
)
def test_an_unhealthy_leader_follows_its_policy(
    policy: str, health: str, standbys: int, hands: bool
) -> None:
    able = [member("b")] * standbys
    assert hands_over(policy, dataclasses.replace(ME, health=health), able) is hands


def test_a_barred_node_sends_reads_never_takes_a_free_lease_and_does_not_spin() -> None:
    n = Node()
    n.s.barred = barred(dataclasses.replace(ME, health=SICK))
    delay = n.answer(free(3))
    assert n.request is not None and not n.request.campaigning  # an observe
    assert delay > MIN_DELAY  # it follows at its pace; a change of health pokes the loop
    assert n.role().value == "follower"
    assert n.s.view(n.t).why == f"not campaigning: unhealthy: {SICK}"


def test_a_barred_node_gives_back_a_grant() -> None:
    n = Node()
    n.answer(free(1))
    n.s.barred = "priority 0 (a witness: it never leads)"
    assert n.s.on_grant(held(ME, 2), n.t, n.t) is False
    assert n.s.release_due == 2


def test_a_leader_whose_checks_fail_still_renews() -> None:
    """Its renewals keep its own lease safe; its policy, not the rules, ends the term."""
    n = leading(Node())
    n.s.barred = f"unhealthy: {SICK}"
    n.at(5)
    n.answer(held(ME, 1, version="2"))
    assert n.request is not None and n.request.campaigning
    assert n.role().value == "leader"


def test_a_witness_never_leads_even_alone() -> None:
    n = Node()
    n.s.barred = barred(Candidate(ME.node_id, priority=0))
    for _ in range(5):
        n.answer(free(0))
        assert n.request is not None and not n.request.campaigning
        assert n.role().value == "follower" and n.s.held_term is None
        n.at(15)


def test_failback_waits_for_a_better_standby_seen_at_every_round_for_its_delay() -> None:
    failback = Failback(2.0)
    better, worse = member("b", priority=2), member("c", priority=1, ago=0.1)
    assert failback.due([better, worse], ME, now=10.0) == ""  # first seen
    assert failback.due([better, worse], ME, now=11.5) == ""
    assert failback.due([better, worse], ME, now=12.0) == "b"  # 2 s at every round
    assert Failback(None).due([better], ME, now=99.0) == ""  # off by default


def test_failback_starts_over_when_a_round_misses_the_standby() -> None:
    """Hysteresis: a node that flaps between rounds never draws leadership."""
    failback, better = Failback(2.0), member("b", priority=2)
    for at in (10.0, 11.0, 13.0, 14.0, 16.0, 17.0):
        assert failback.due([better], ME, now=at) == ""
        assert failback.due([], ME, now=at + 0.5) == ""  # unhealthy at this round
    assert failback.due([better], ME, now=20.0) == ""
    assert failback.due([better], ME, now=22.0) == "b"


def test_a_leader_decides_unhealthy_hand_over_before_failback() -> None:
    sick = dataclasses.replace(ME, health=SICK)
    b = member("b", priority=2)
    failback = Failback(0.0)
    assert decide("handover", failback, sick, [b], 1.0) == (
        "",
        f"handed over: leader unhealthy ({SICK})",
    )
    assert decide("step-down", failback, sick, [], 1.0) == (
        "",
        f"stepped down: leader unhealthy ({SICK})",
    )
    assert decide("handover", failback, ME, [b], 1.0) == ("b", "handed over: failback to b")
    assert decide("handover", Failback(None), ME, [b], 1.0) is None


def test_on_a_backend_that_does_not_grant_any_live_healthy_standby_will_do() -> None:
    """The advisory lock's standbys wait inside the lock: their heartbeats (reads) never
    say they campaign, and they take the freed lock themselves."""
    waiting = member("b", campaigning=False, ago=10.0)  # within its 15 s ttl
    sick = member("c", campaigning=False, health=SICK)
    assert standbys([waiting, sick], ME, 0.0, grants=True) == []
    assert [m.node_id for m in standbys([waiting, sick], ME, 0.0, grants=False)] == ["b"]
    assert standbys([waiting], ME, 6.0, grants=False) == []  # silent for its ttl: stale
