"""A switchover asked for from any node (leaderd/election/switchover_request.py): carried in
the asking node's member record, done by whoever leads between its time and its expiry,
only to a standby a hand-over may go to, and withdrawn once done or expired."""

from __future__ import annotations

from leaderd.backends.records import Member
from leaderd.election.status import LeaderInfo
from leaderd.election.switchover_request import SwitchoverRequest, due_to, pending, still_wanted


def member(node_id: str, switchover: str = "") -> Member:
    return Member(node_id, f"i-{node_id}", "", "", 15.0, None, 0.1, True, switchover=switchover)


def test_a_request_round_trips_through_a_member_record() -> None:
    request = SwitchoverRequest("node-b", 100.0, 160.0)
    assert SwitchoverRequest.decode(request.encode()) == request
    assert SwitchoverRequest.decode("") is None
    assert SwitchoverRequest.decode("node-b soon") is None  # another version's: ignored


def test_the_leader_acts_between_at_and_until_and_only_for_an_able_standby() -> None:
    asked = SwitchoverRequest("node-b", 100.0, 160.0).encode()
    members = [member("node-a"), member("node-b"), member("node-c", asked)]
    able = [m for m in members if m.node_id != "node-a"]
    assert due_to(members, able, "node-a", wall=99.0) == ""  # scheduled: not yet
    assert due_to(members, able, "node-a", wall=100.0) == "node-b"
    assert due_to(members, able[1:], "node-a", wall=120.0) == ""  # node-b unhealthy, say
    assert due_to(members, able, "node-b", wall=120.0) == ""  # node-b leads already
    assert due_to(members, able, "node-a", wall=160.0) == ""  # expired
    assert [by for by, _ in pending(members, 120.0)] == ["node-c"]
    assert pending(members, 160.0) == []


def test_the_asking_node_withdraws_it_once_done_or_expired() -> None:
    asked = SwitchoverRequest("node-b", 100.0, 160.0).encode()
    a, b = (LeaderInfo(n, "", 7, None) for n in ("node-a", "node-b"))
    assert still_wanted(asked, a, 120.0) == asked
    assert still_wanted(asked, None, 120.0) == asked
    assert still_wanted(asked, b, 120.0) == ""
    assert still_wanted(asked, a, 160.0) == ""
    assert still_wanted("", a, 120.0) == ""
