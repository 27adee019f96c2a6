"""The checker's rules on hand-made observations: what must and must not count as a violation."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.chaos.check import (
    Claim,
    Fault,
    Span,
    check_commands,
    check_liveness,
    check_safety,
    failover_stats,
    spans,
)
from tests.support.chaos.process_faults import processes_naming


def kinds(claims: list[Claim]) -> dict[str, int]:
    return check_safety(claims).counts


def test_one_leader_after_another_is_fine() -> None:
    claims = [Claim("a", 1, 0.0, 0.1), Claim("a", 1, 0.5, 0.6), Claim("b", 2, 1.0, 1.1)]
    assert kinds(claims) == {}


def test_same_term_on_two_nodes_is_a_violation_whatever_the_timing() -> None:
    assert kinds([Claim("a", 3, 0.0, 0.1), Claim("b", 3, 50.0, 50.1)]) == {"same_term_two_nodes": 1}


def test_lower_term_answered_after_a_higher_one_was_seen() -> None:
    # b led with term 2 (answer received at 1.1); a's request sent at 1.2 says term 1.
    found = check_safety([Claim("b", 2, 1.0, 1.1), Claim("a", 1, 1.2, 1.3)])
    assert found.counts == {"stale_leader": 1}
    assert found.listed[0]["stale"]["node"] == "a"


def test_overlapping_windows_prove_nothing() -> None:
    # a's answer may have been produced before b's lease began: not a proven overlap.
    assert kinds([Claim("b", 2, 1.0, 1.3), Claim("a", 1, 1.2, 1.4)]) == {}
    # Received exactly when the other was sent: still orderable either way.
    assert kinds([Claim("b", 2, 1.0, 1.2), Claim("a", 1, 1.2, 1.4)]) == {}


def test_a_node_whose_term_goes_backwards() -> None:
    assert kinds([Claim("a", 5, 0.0, 0.1), Claim("a", 4, 0.2, 0.3)]) == {"stale_leader": 1}


def test_a_watch_event_counts_from_when_its_stream_was_opened() -> None:
    # The event says b led at some instant between opening the stream (0) and 2.0.
    assert kinds([Claim("b", 2, 0.0, 2.0, "watch"), Claim("a", 1, 2.5, 2.6)]) == {"stale_leader": 1}
    assert kinds([Claim("b", 2, 0.0, 2.0, "watch"), Claim("a", 1, 1.5, 2.6)]) == {}


def test_a_pair_is_reported_once_however_many_answers_repeat_it() -> None:
    claims = [Claim("b", 2, 1.0, 1.1)] + [Claim("a", 1, 1.2 + i / 100, 1.3) for i in range(50)]
    assert kinds(claims) == {"stale_leader": 1}


def fault(ref: float, kind: str = "sigkill") -> Fault:
    return Fault(0, kind, "a", "leader", ref, ref, ref)


def test_liveness_counts_from_ref_to_the_first_answer_sent_after_it() -> None:
    f = fault(10.0)
    # The answer sent at 10.1 to a stopped daemon arrives at 14: the one sent at 11 counts.
    claims = [Claim("a", 1, 9.0, 9.1), Claim("a", 1, 10.1, 14.0), Claim("b", 2, 11.0, 11.2)]
    assert check_liveness([f], claims, bound=3.0, end=20.0).counts == {}
    assert abs(f.recovery - 1.2) < 1e-9  # type: ignore[operator]
    assert failover_stats([f]) == {
        "sigkill": {"n": 1, "p50_ms": 1200.0, "p99_ms": 1200.0, "max_ms": 1200.0}
    }


def test_no_leader_within_the_bound_is_a_liveness_violation() -> None:
    claims = [Claim("b", 2, 13.5, 13.6)]
    assert check_liveness([fault(10.0)], claims, bound=3.0, end=20.0).counts == {"liveness": 1}
    assert check_liveness([fault(10.0)], [], bound=3.0, end=20.0).counts == {"liveness": 1}
    # The run ended before the bound passed: nothing can be said.
    assert check_liveness([fault(10.0)], [], bound=3.0, end=12.0).counts == {}


def span(instance: str, node: str, term: int, first: float, last: float) -> Span:
    return Span(instance, node, term, first, last)


def test_commands_one_after_another_are_fine() -> None:
    found = [span("1", "a", 1, 0.0, 1.0), span("2", "b", 2, 1.2, 3.0), span("3", "a", 3, 3.5, 4)]
    assert check_commands(found).counts == {}


def test_a_command_starting_before_another_s_last_beat_is_two_at_once() -> None:
    found = [span("1", "a", 1, 0.0, 1.0), span("2", "b", 2, 0.9, 3.0)]
    violations = check_commands(found)
    assert violations.counts == {"two_commands": 1}
    assert violations.listed[0]["first"]["node"] == "a"


def test_a_long_lived_leftover_overlaps_every_later_command() -> None:
    # a's worker beat until 10 s: b's and c's commands both ran beside it.
    found = [span("1", "a", 1, 0.0, 10.0), span("2", "b", 2, 2.0, 3.0), span("3", "c", 3, 4, 5)]
    assert check_commands(found).counts == {"two_commands": 2}


def test_beats_are_grouped_by_instance_and_a_cut_line_is_skipped() -> None:
    text = "beat a 1 x 0.5\nbeat a 1 x 1.5\nbeat b 2 y 1.0\nbeat a 1 x 2.0\nbeat b 2"
    found = spans(text)
    assert [(s.instance, s.first, s.last) for s in found] == [("x", 0.5, 2.0), ("y", 1.0, 1.0)]
    assert check_commands(found).counts == {"two_commands": 1}


def test_real_commands_alive_at_once_are_caught(tmp_path: Path) -> None:
    """The heartbeats of tests/chaos/command.py itself: one pair at once, one after another."""
    beats = str(tmp_path / "beats")

    def command(node: str, term: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, "LEADERD_NODE_ID": node, "LEADERD_TERM": str(term),
               "PYTHONPATH": str(Path(__file__).parents[2])}  # fmt: skip
        return subprocess.Popen([sys.executable, "-m", "tests.chaos.command", beats], env=env)

    def kill_all() -> None:  # the commands and their workers, which left their sessions
        for pid in processes_naming(beats):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    try:
        first = command("a", 1)
        time.sleep(0.5)
        command("b", 2)  # while a's still runs
        time.sleep(0.5)
        kill_all()
        time.sleep(0.2)
        assert check_commands(spans(Path(beats).read_text())).counts == {"two_commands": 1}
        first.wait()
        Path(beats).unlink()
        command("c", 3)
        time.sleep(0.5)
        kill_all()
        time.sleep(0.2)
        command("d", 4)
        time.sleep(0.5)
    finally:
        kill_all()
    found = spans(Path(beats).read_text())
    assert [s.node for s in found] == ["c", "d"]
    assert check_commands(found).counts == {}
