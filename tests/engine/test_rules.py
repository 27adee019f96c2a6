"""docs/algorithm.md's state table, row by row, against ElectionState: synchronous, no
asyncio, exact times. Each case is named by its row number in that table."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

from leaderd.backends.base import BackendUnavailable, Candidate, Lease, LeaseLost
from leaderd.election.state import MIN_DELAY, ElectionState
from leaderd.election.status import Role
from leaderd.election.timing import Timing
from leaderd.election.values import Request

T = Timing(ttl=15, renew_interval=5, retry_interval=2, clock_drift=0.01, safety_margin=0.2)
ME = Candidate("node-a", "10.0.0.1:8080")
X = Candidate("node-x", "10.0.0.2:8080")
TWIN = Candidate("node-a", "10.0.0.9:8080")
AT = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)


def held(by: Candidate, term: int, version: str = "1", expires_in: float = 15.0) -> Lease:
    return Lease("default", by.node_id, by.address, term, AT, expires_in, by.instance, version)


def free(term: int) -> Lease:
    return Lease("default", None, "", term, None, None)


def reserved(term: int, to: Candidate, reserved_in: float) -> Lease:
    return Lease("default", None, "", term, None, None, reserved_for=to.node_id,
                 reserved_in=reserved_in)  # fmt: skip


def handing_over(n: Node) -> Node:
    """node-a led with term 1, resigned to node-x, and released reserving the lease for it."""
    leading(n)
    n.s.resign(n.t, 30, to=X.node_id)
    assert n.s.term_to_release() == 1 and n.s.reservation_due() == X.node_id
    n.s.on_reserved(X.node_id, 1)
    return n


class Node:
    """One ElectionState driven by hand: each answer is sent at ``t`` and read at once."""

    def __init__(self) -> None:
        self.s = ElectionState("default", ME, T, jitter=lambda: 0.0)
        self.t = 100.0
        self.request: Request | None = None

    def answer(self, lease: Lease) -> float:
        self.request = self.s.request(self.t)
        notes = self.s.on_lease(lease, self.request, self.t, self.t)
        self.notes = notes
        return self.s.next_round(self.request, self.t, self.t)

    def fail(self, exc: Exception) -> float:
        request = self.s.request(self.t)
        self.s.on_failure(exc, request)
        return self.s.retry_delay()

    def at(self, seconds: float) -> Node:
        self.t += seconds
        return self

    def role(self) -> Role:
        return self.s.view(self.t).role

    def leader(self) -> str | None:
        leader = self.s.view(self.t).leader
        return leader.node_id if leader else None


def leading(n: Node, term: int = 1) -> Node:
    n.answer(held(ME, term))
    assert n.role() is Role.LEADER
    return n


def row1(n: Node) -> None:
    n.answer(held(ME, 1))
    assert (n.role(), n.leader(), n.s.view(n.t).term) == (Role.LEADER, "node-a", 1)
    assert n.s.deadline == pytest.approx(n.t + T.lease_window)
    assert n.s.sentence(None, n.s.view(n.t), n.t) == "acquired election default, term 1"


def row2(n: Node) -> None:
    delay = n.answer(held(X, 1))
    assert (n.role(), n.leader()) == (Role.FOLLOWER, "node-x")
    assert delay == T.retry_interval and n.s.watched is not None


def row3(n: Node) -> None:
    n.s.resign(n.t, 30)
    delay = n.answer(free(1))
    assert (n.role(), n.leader()) == (Role.FOLLOWER, None)
    assert n.request is not None and not n.request.campaigning  # observe
    assert delay == T.renew_interval  # and the cooldown ends later still


def row4(n: Node) -> None:
    n.answer(held(X, 1, expires_in=3))
    n.at(3)
    assert (n.role(), n.leader()) == (Role.FOLLOWER, None)
    assert n.s.request(n.t).ask.takeover == ""  # seen for 3 s only


def row5(n: Node) -> None:
    n.answer(held(X, 1, version="7", expires_in=1))
    n.at(T.ttl)
    assert n.s.request(n.t).ask.takeover == "7"
    n.answer(held(ME, 2))
    assert (n.role(), n.s.view(n.t).term) == (Role.LEADER, 2)


def row6(n: Node) -> None:
    n.answer(held(X, 1, version="7"))
    n.at(10).answer(held(X, 1, version="8"))
    n.at(10)
    assert n.s.request(n.t).ask.takeover == ""  # "8" was first seen 10 s ago
    n.at(5)
    assert n.s.request(n.t).ask.takeover == "8"


def row7(n: Node) -> None:
    n.answer(held(X, 1, expires_in=60))
    n.at(T.ttl - 0.001)
    assert n.role() is Role.FOLLOWER
    n.at(0.001)
    assert (n.role(), n.leader()) == (Role.UNKNOWN, None)


def row8(n: Node) -> None:
    n.answer(held(X, 1))
    n.at(1).answer(free(1))
    assert n.s.request(n.t).ask.min_term == 2
    n.answer(held(ME, 2))
    assert (n.role(), n.s.view(n.t).term) == (Role.LEADER, 2)


def row9(n: Node) -> None:
    n.answer(held(TWIN, 1))
    assert (n.role(), n.leader()) == (Role.FOLLOWER, "node-a")
    assert [note.event for note in n.notes] == ["duplicate_node_id"]
    n.at(1).answer(held(TWIN, 1, version="2"))
    assert n.notes == [] and n.s.duplicates_seen == 1  # told once per instance


def row10(n: Node) -> None:
    leading(n)
    before = n.s.view(n.t).key
    n.at(5).answer(held(ME, 1, version="2"))
    assert n.s.view(n.t).key == before and n.s.deadline == pytest.approx(n.t + T.lease_window)


def row11(n: Node) -> None:
    leading(n)
    n.at(5)
    assert n.fail(BackendUnavailable("down")) == T.retry_interval
    assert n.role() is Role.LEADER and n.s.last_error == "down"


def row12(n: Node) -> None:
    leading(n)
    start = n.t
    n.fail(BackendUnavailable("down"))
    previous = n.s.view(n.t)
    n.t = start + T.lease_window
    view = n.s.view(n.t)
    assert view.role is Role.UNKNOWN
    assert n.s.sentence(previous, view, n.t) == (
        "stepping down from election default, term 1: "
        f"no successful renewal for {T.lease_window:.1f}s, deadline passed"
    )


def row13(n: Node) -> None:
    leading(n)
    previous = n.s.view(n.t)
    n.at(5).answer(held(X, 2))
    view = n.s.view(n.t)
    assert (view.role, n.leader()) == (Role.FOLLOWER, "node-x")
    sentence = n.s.sentence(previous, view, n.t)
    assert (
        sentence == "stepping down from election default, term 1: node-x holds the lease (term 2)"
    )


def row14(n: Node) -> None:
    leading(n)
    n.at(1).fail(LeaseLost("SQLite lease file x was deleted while in use"))
    view = n.s.view(n.t)
    assert view.role is Role.UNKNOWN and "was deleted" in view.why


def row15(n: Node) -> None:
    leading(n)
    n.s.resign(n.t, 30)
    view = n.s.view(n.t)
    assert (view.role, view.leader) == (Role.FOLLOWER, None)
    assert view.why == "resigned, not campaigning for 30s"
    assert n.s.term_to_release() == 1
    assert not n.s.request(n.t + 29).campaigning and n.s.request(n.t + 30).campaigning


def row16(n: Node) -> None:
    n.answer(held(X, 5))
    n.at(1).answer(free(5))
    n.answer(held(ME, 3))  # a backend that lost writes grants a term already seen
    assert n.role() is not Role.LEADER and n.s.terms_refused == 1
    assert [note.event for note in n.notes] == ["term_refused"]
    assert n.s.term_to_release() == 3 and n.s.request(n.t).ask.min_term == 6


def row17(n: Node) -> None:
    leading(n)
    n.s.stop()
    assert n.role() is Role.STOPPED and n.s.term_to_release() == 1
    assert not n.s.request(n.t).campaigning


def row18(n: Node) -> None:
    leading(n)
    previous = n.s.view(n.t)
    n.s.resign(n.t, 30, to=X.node_id)
    view = n.s.view(n.t)
    assert (view.role, view.leader) == (Role.FOLLOWER, None)
    assert n.s.sentence(previous, view, n.t) == (
        "stepping down from election default, term 1: resigned, handing over to node-x"
    )
    assert n.s.term_to_release() == 1
    assert n.s.reservation_due() == X.node_id and n.s.reservation_due() == ""  # once


def row19(n: Node) -> None:
    n.answer(held(X, 4))
    delay = n.at(1).answer(reserved(4, X, reserved_in=9.0))
    view = n.s.view(n.t)
    assert (view.role, view.leader) == (Role.FOLLOWER, None)
    assert view.why == "the lease is reserved for node-x (a hand-over)"
    assert delay == T.retry_interval and n.s.watched is None and n.s.request(n.t).ask.takeover == ""
    # Asked again the moment the reservation ends, not after a free lease's renew_interval.
    assert n.at(2).answer(reserved(4, X, reserved_in=0.7)) == pytest.approx(0.7)
    # Reserved for this very node: free to it, like row 8.
    assert n.answer(reserved(4, ME, reserved_in=9.0)) >= T.renew_interval


def row20(n: Node) -> None:
    handing_over(n)
    n.at(0.1).answer(reserved(1, X, reserved_in=14.9))
    assert n.notes == []  # the reservation lasts: no outcome yet
    n.at(0.1).answer(held(X, 2))
    assert [(note.event, note.sentence) for note in n.notes] == [
        ("handed_over", "handed election default over to node-x, term 2")
    ]
    n.at(2).answer(held(X, 2))
    assert n.notes == []  # told once


def row21(n: Node) -> None:
    handing_over(n)
    n.at(15).answer(free(1))
    assert [note.event for note in n.notes] == ["handover_lapsed"]
    assert n.notes[0].sentence.startswith("election default: node-x did not take the lease")
    assert n.notes[0].sentence.endswith("any standby may take it")
    n.at(5).answer(free(1))
    assert n.notes == []  # told once


def release_in_doubt(n: Node) -> Node:
    """node-a led term 1, resigned with no cooldown, and its release gave no answer."""
    leading(n)
    n.s.resign(n.t, 0)
    n.s.in_doubt.on_unknown(n.s.term_to_release() or 0)
    return n


def row22(n: Node) -> None:
    release_in_doubt(n)
    assert n.role() is Role.FOLLOWER and n.s.in_doubt.term == 1
    assert not n.s.request(n.t).campaigning  # observe only


def row23(n: Node) -> None:
    delay = release_in_doubt(n).answer(held(ME, 1, version="5"))
    assert (n.role(), n.s.release_due, delay) == (Role.FOLLOWER, 1, MIN_DELAY)


def row24(n: Node) -> None:
    release_in_doubt(n).answer(free(1))
    assert n.s.in_doubt.term is None and n.s.request(n.t).campaigning
    n.answer(held(ME, 2))
    assert (n.role(), n.s.view(n.t).term) == (Role.LEADER, 2)


def row25(n: Node) -> None:
    leading(n)
    previous = n.s.view(n.t)
    n.at(1).answer(held(ME, 2))  # the renewal found the lease gone and took it again
    view = n.s.view(n.t)
    assert (view.role, view.term) == (Role.LEADER, 2)
    assert n.s.deadline == pytest.approx(n.t + T.lease_window)
    assert n.s.sentence(previous, view, n.t) == "acquired election default, term 2; term 1 ended"


LAST_ROW = 25
ROWS: dict[str, Callable[[Node], None]] = {
    f"row {i}": globals()[f"row{i}"] for i in range(1, LAST_ROW + 1)
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_state_table(row: Callable[[Node], None]) -> None:
    row(Node())


def test_every_row_of_the_documented_table_has_a_case() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "algorithm.md").read_text()
    table = doc[doc.index("| # | state |") :].split("\n\n")[0]
    numbers = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert numbers == [str(i) for i in range(1, LAST_ROW + 1)]
