"""What a term's history record tells besides how it ended: this node's transition hook
failures during the term (docs/run.md, "Transition hooks"). They ride on the release's
end reason, which every backend records in the write that ends the term, so they need no
write of their own and reach every node's GET /history."""

from __future__ import annotations

from ..backends.records import NOTE_SEPARATOR, NotedReason

MAX_NOTES = 3  # per term: a record stays one line however often a hook fails
MAX_TERMS = 8  # terms with notes kept: those of terms lost, never released, go in turn


class TermNotes:
    """Notes kept until this node releases the term they are about."""

    def __init__(self) -> None:
        self._notes: dict[int, list[str]] = {}
        self._more: dict[int, int] = {}  # notes past MAX_NOTES, counted only

    def add(self, term: int, note: str) -> None:
        """Note ``note`` (e.g. "on_elected hook failed with status 3") on ``term``."""
        if term not in self._notes and len(self._notes) >= MAX_TERMS:
            oldest = min(self._notes)
            del self._notes[oldest]
            self._more.pop(oldest, None)
        kept = self._notes.setdefault(term, [])
        if len(kept) < MAX_NOTES:
            kept.append(note)
        else:
            self._more[term] = self._more.get(term, 0) + 1

    def ended(self, term: int, reason: str) -> str:
        """The end reason a release of ``term`` records: ``reason`` and the term's notes.
        Notes on this and older terms are forgotten (an older term ended without a
        release of ours: another node wrote its record)."""
        notes = self._notes.pop(term, [])
        more = self._more.pop(term, 0)
        for old in [t for t in self._notes if t < term]:
            del self._notes[old]
            self._more.pop(old, None)
        if more:
            notes.append(f"{more} more hook failures")
        return NotedReason(reason, NOTE_SEPARATOR.join(notes)) if notes else reason
