"""The chaos checker: pure functions from what was observed to violations and failover times.

Every time here is the harness's ``time.monotonic()``: one clock, so answers can be ordered.

An answer "leader" to a request sent at ``sent`` and answered at ``received`` proves only
that the daemon led at SOME instant of ``[sent, received]``. Terms order tenures: a term is
acquired once and held by one node (rule 4), and at most one node leads at any instant
(§1.1), so every instant of term ``t`` precedes every instant of any term ``u > t``. Hence:

* ``same_term_two_nodes``: two different nodes answered leader with the same term.
* ``stale_leader``: a leader answer with term ``t`` whose request was sent strictly after a
  leader answer with a term ``u > t`` was received (``b.received < a.sent``): term ``u`` was
  held before term ``t`` — a deposed leader still answering "leader" (also when ``a`` and
  ``b`` come from the same node: a term went backwards).

* ``two_commands`` (with ``Settings.supervise``): two supervised commands alive at one
  instant, from their heartbeats (``check_commands``).

Together the first two catch every overlap the observations can prove: if node A is seen leading
with term t at windows w1 and w3, and node B with term u != t at a window w2 between them
(w1 received before w2 sent, w2 received before w3 sent), one of the two pairs is stale.
Two answers whose windows overlap prove nothing and are not reported: a checker that
guesses would fail correct engines.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Reported in full up to this many per kind; the count is always exact.
MAX_LISTED = 20


@dataclass(frozen=True, slots=True)
class Claim:
    """One answer "I am the leader": the node led with ``term`` at some instant in the window."""

    node: str
    term: int
    sent: float
    received: float
    source: str = "poll"  # "poll" (/leader) or "watch" (a /watch?stream=1 event)


@dataclass(slots=True)
class Fault:
    """One injected fault. ``ref`` is when a leader is owed from: the injection for faults that
    take the leader away at once, the heal for faults that hold everyone back while they last."""

    index: int
    kind: str
    target: str  # a node id, "postgres" or "sqlite"
    target_role: str  # "leader", "follower" or "-" (the database)
    injected: float
    healed: float
    ref: float
    params: dict[str, Any] = field(default_factory=dict)
    recovery: float | None = None  # seconds from ref to the first leader answer sent after it

    def as_dict(self, t0: float) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "target": self.target,
            "target_role": self.target_role,
            "injected_s": round(self.injected - t0, 4),
            "healed_s": round(self.healed - t0, 4),
            "ref_s": round(self.ref - t0, 4),
            "recovery_s": None if self.recovery is None else round(self.recovery, 4),
            **self.params,
        }


@dataclass(slots=True)
class Violations:
    counts: dict[str, int] = field(default_factory=dict)
    listed: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, **details: Any) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.counts[kind] <= MAX_LISTED:
            self.listed.append({"kind": kind, **details})

    def merge(self, other: Violations) -> None:
        for kind, n in other.counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
        self.listed += other.listed

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _claim(c: Claim, t0: float) -> dict[str, Any]:
    return {
        "node": c.node,
        "term": c.term,
        "source": c.source,
        "sent_s": round(c.sent - t0, 4),
        "received_s": round(c.received - t0, 4),
    }


def check_safety(claims: Iterable[Claim], t0: float = 0.0) -> Violations:
    """Rules ``same_term_two_nodes`` and ``stale_leader`` (module docstring); O(n log n)."""
    found = Violations()
    claims = list(claims)
    holder: dict[int, Claim] = {}
    reported: set[tuple[Any, ...]] = set()
    for c in claims:
        first = holder.setdefault(c.term, c)
        key = ("same", c.term, first.node, c.node)
        if first.node != c.node and key not in reported:
            reported.add(key)
            found.add(
                "same_term_two_nodes", term=c.term, first=_claim(first, t0), second=_claim(c, t0)
            )
    by_received = sorted(claims, key=lambda c: c.received)
    highest: Claim | None = None
    i = 0
    for a in sorted(claims, key=lambda c: c.sent):
        while i < len(by_received) and by_received[i].received < a.sent:
            b = by_received[i]
            if highest is None or b.term > highest.term:
                highest = b
            i += 1
        if highest is not None and highest.term > a.term:
            stale = ("stale", a.node, a.term, highest.node, highest.term)
            if stale not in reported:
                reported.add(stale)
                found.add(
                    "stale_leader",
                    stale=_claim(a, t0),
                    seen_before=_claim(highest, t0),
                    explanation=(
                        f"{a.node} answered leader with term {a.term} to a request sent after "
                        f"{highest.node} was seen leading with term {highest.term}"
                    ),
                )
    return found


def check_liveness(
    faults: Sequence[Fault], claims: Sequence[Claim], bound: float, end: float, t0: float = 0.0
) -> Violations:
    """Set each fault's ``recovery``: from ``ref`` to the receipt of the first poll answer
    "leader" whose request was sent at or after ``ref``. Over ``bound`` (or none while the
    run went on for ``bound``) is a ``liveness`` violation."""
    found = Violations()
    polls = sorted((c for c in claims if c.source == "poll"), key=lambda c: c.received)
    received = [c.received for c in polls]
    for fault in faults:
        # The earliest answer to a request sent at or after ref (not the earliest sent:
        # a request to a SIGSTOPped daemon is answered only after SIGCONT).
        i = bisect.bisect_left(received, fault.ref)
        first = next((c for c in itertools.islice(polls, i, None) if c.sent >= fault.ref), None)
        fault.recovery = None if first is None else first.received - fault.ref
        late = fault.recovery is None and end - fault.ref > bound
        if late or (fault.recovery is not None and fault.recovery > bound):
            found.add(
                "liveness",
                fault=fault.as_dict(t0),
                bound_s=round(bound, 3),
                explanation=f"no leader within {bound:.2f}s of fault {fault.index} ({fault.kind})",
            )
    return found


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in [0, 100]) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def failover_stats(faults: Iterable[Fault]) -> dict[str, dict[str, float | int]]:
    """Recovery time per fault kind, for faults that hit the leader or the database."""
    groups: dict[str, list[float]] = {}
    for f in faults:
        if f.target_role in ("leader", "-") and f.recovery is not None:
            groups.setdefault(f.kind, []).append(f.recovery)
    return {
        kind: {
            "n": len(v),
            "p50_ms": round(percentile(v, 50) * 1000, 1),
            "p99_ms": round(percentile(v, 99) * 1000, 1),
            "max_ms": round(max(v) * 1000, 1),
        }
        for kind, v in sorted(groups.items())
    }


@dataclass(frozen=True, slots=True)
class Span:
    """One start of a supervised command (tests/chaos/command.py), with all it started:
    alive at least from its first heartbeat to its last."""

    instance: str
    node: str
    term: int
    first: float
    last: float


def spans(text: str) -> list[Span]:
    """Heartbeat lines "beat NODE TERM INSTANCE MONOTONIC" grouped by instance."""
    found: dict[str, Span] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 5 or fields[0] != "beat":  # a line cut by a kill
            continue
        _, node, term, instance, at = fields
        seen = found.get(instance)
        t = float(at)
        if seen is None:
            found[instance] = Span(instance, node, int(term), t, t)
        else:
            found[instance] = Span(instance, node, seen.term, min(seen.first, t), max(seen.last, t))
    return sorted(found.values(), key=lambda s: s.first)


def check_commands(found: Sequence[Span], t0: float = 0.0) -> Violations:
    """Rule ``two_commands``: two supervised commands alive at one instant. A process lives
    one interval, so a command (and what it started) ran at least from its first beat to its
    last; a span that starts before an earlier one's last beat overlaps it. O(n log n)."""
    violations = Violations()
    longest: Span | None = None  # of the spans so far, the one that lasted longest
    for span in sorted(found, key=lambda s: s.first):
        if longest is not None and span.first < longest.last:
            violations.add(
                "two_commands",
                first={"node": longest.node, "term": longest.term,
                       "alive_s": [round(longest.first - t0, 4), round(longest.last - t0, 4)]},
                second={"node": span.node, "term": span.term,
                        "alive_s": [round(span.first - t0, 4), round(span.last - t0, 4)]},
                explanation=(
                    f"{span.node}'s command (term {span.term}) beat at "
                    f"{span.first - t0:.3f}s while {longest.node}'s (term {longest.term}) "
                    f"still beat until {longest.last - t0:.3f}s"
                ),
            )  # fmt: skip
        if longest is None or span.last > longest.last:
            longest = span
    return violations
