"""Notes on a term (hook failures) ride on its release's end reason (term_notes.py)."""

from __future__ import annotations

from leaderd.backends.records import EndReason, end_text
from leaderd.election.term_notes import MAX_NOTES, MAX_TERMS, TermNotes


def test_a_release_carries_the_notes_of_its_own_term_only() -> None:
    notes = TermNotes()
    notes.add(4, "on_demoted hook failed with status 1")
    notes.add(5, "on_elected hook failed with status 3")
    notes.add(5, "on_stop hook cannot start: No such file or directory")
    ended = notes.ended(5, EndReason.RELEASED)
    assert ended == ("released; on_elected hook failed with status 3; "
                     "on_stop hook cannot start: No such file or directory")  # fmt: skip
    # Told once; term 4's note (a term another node ended) is forgotten with it.
    assert notes.ended(5, EndReason.RELEASED) == "released"
    assert notes.ended(4, EndReason.RESIGNED) == "resigned"


def test_a_switchover_keeps_the_notes_after_the_node_it_went_to() -> None:
    notes = TermNotes()
    notes.add(7, "on_demoted hook timed out after 0.5s: killed")
    reason = notes.ended(7, "handed over: leader unhealthy (disk: a; b)")
    assert end_text(reason, "node-b") == (
        "handed over to node-b; on_demoted hook timed out after 0.5s: killed"
    )
    assert (
        end_text("handed over: leader unhealthy (disk: a; b)", "node-b") == "handed over to node-b"
    )


def test_a_hook_failing_over_and_over_keeps_the_record_one_line() -> None:
    notes = TermNotes()
    for _ in range(MAX_NOTES + 4):
        notes.add(9, "on_elected hook failed with status 3")
    ended = notes.ended(9, EndReason.RESIGNED)
    assert ended.count("status 3") == MAX_NOTES and ended.endswith("; 4 more hook failures")


def test_notes_on_terms_never_released_are_bounded() -> None:
    notes = TermNotes()
    for term in range(1, MAX_TERMS + 3):
        notes.add(term, f"on_demoted hook failed with status {term}")
    assert notes.ended(1, EndReason.RELEASED) == "released"  # the oldest went first
    last = MAX_TERMS + 2
    assert notes.ended(last, EndReason.RELEASED).endswith(f"status {last}")
