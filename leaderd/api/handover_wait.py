"""`leaderd resign --to NODE` waits for the outcome: the old leader's own /watch tells when
NODE leads, or that another node took the election (the reservation lapsed), or nothing did
within --timeout (docs/api.md, "Hand-over to a chosen standby").

Standard library only, like the rest of the client: the command imports no event loop.
"""

from __future__ import annotations

from typing import Any

from ..clock import boottime
from . import client

# Slack for the answer beyond the long poll's own wait; the longest wait GET /watch takes.
_ANSWER_SLACK = 2.0
_LONGEST_POLL = 300.0


class NotTaken(Exception):
    """The chosen standby did not take the election; the message says what happened."""


def wait_until_leads(
    socket_path: str, election: str | None, to: str, stepped_down: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """The status once ``to`` leads with a term after the one this node stepped down from
    (``stepped_down``: resign's answer); raise NotTaken if another node took it, or if
    ``to`` did not within ``timeout`` seconds. Raise client.Unreachable as requests do."""
    term, revision = int(stepped_down["term"]), stepped_down["revision"]
    name = stepped_down["election"]
    give_up = boottime() + timeout
    status = stepped_down
    while True:
        leader = (status.get("leader") or {}).get("node_id")
        if leader == to and int(status["term"]) > term:
            return status
        if leader is not None and leader != to and int(status["term"]) > term:
            message = f"{to} did not take election {name}: {leader} leads it, term {status['term']}"
            raise NotTaken(message + " (the reservation lapsed)")
        left = give_up - boottime()
        if left <= 0:
            now = f"leader {leader}" if leader else "no leader"
            raise NotTaken(f"{to} did not take election {name} within {timeout:g}s ({now})")
        url = client.election_path(
            "/watch", election, revision=revision, timeout=f"{min(left, _LONGEST_POLL):.3f}"
        )
        code, status = client.request(socket_path, "GET", url, left + _ANSWER_SLACK)
        if code != 200:
            raise NotTaken(f"watching election {name} failed: {status!r}")
        revision = status["revision"]
