"""The log-event schema: every event leaderd logs, and the fields it carries, declared once.

Each decision is one log line (or journal entry) whose ``event`` field names it and whose
other fields are listed here; JSON logs and the journal carry every one of them
(tests/foundation/test_events.py formats each event and checks nothing is lost). Build the
``extra=`` of a log call with ``extra(Event.X, field=value, ...)``: a field not declared for
the event is a programming error.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Event(StrEnum):
    # The daemon's life.
    STARTING = "starting"
    SOCKET_ERROR = "socket_error"
    READY = "ready"
    STOPPING = "stopping"  # a stop signal came: handing over
    EXITED = "exited"  # the hand-over is over; the process ends
    # An election's view changed: the event is the new role.
    LEADER = "leader"
    FOLLOWER = "follower"
    UNKNOWN = "unknown"
    STOPPED = "stopped"  # this election stopped campaigning
    # Backend requests and their outcome.
    RENEW_FAILED = "renew_failed"
    BACKEND_ERROR = "backend_error"
    RELEASED = "released"
    RELEASE_FAILED = "release_failed"
    HANDED_OVER = "handed_over"  # the node a hand-over reserved the lease for took it
    HANDOVER_LAPSED = "handover_lapsed"  # ... or did not, within its reservation
    DUPLICATE_NODE_ID = "duplicate_node_id"
    TERM_REFUSED = "term_refused"
    LISTEN_DOWN = "listen_down"
    LISTEN_UP = "listen_up"
    # The supervised command (run -- COMMAND).
    CHILD_STARTED = "child_started"
    CHILD_STOPPING = "child_stopping"
    CHILD_STOPPED = "child_stopped"
    CHILD_EXITED = "child_exited"
    CHILD_FAILED = "child_failed"
    CONTAINMENT = "containment"  # how COMMAND's tree is contained (PID namespace, cgroup, ...)
    KEEPER_DIED = "keeper_died"  # an internal failure, never the child's exit
    KEEPER_UNRESPONSIVE = "keeper_unresponsive"


_VIEW = frozenset({"election", "term", "holder"})
FIELDS: dict[Event, frozenset[str]] = {
    Event.STARTING: frozenset({"socket"}),
    Event.SOCKET_ERROR: frozenset(),
    Event.READY: frozenset(),
    Event.STOPPING: frozenset({"signal"}),
    Event.EXITED: frozenset({"status"}),
    Event.LEADER: _VIEW,
    Event.FOLLOWER: _VIEW,
    Event.UNKNOWN: _VIEW,
    Event.STOPPED: _VIEW,
    Event.RENEW_FAILED: frozenset({"election", "reason"}),
    Event.BACKEND_ERROR: frozenset({"election", "reason"}),
    Event.RELEASED: frozenset({"election", "term", "reserved_for"}),
    Event.HANDED_OVER: _VIEW | {"to"},
    Event.HANDOVER_LAPSED: _VIEW | {"to"},
    Event.RELEASE_FAILED: frozenset({"election", "term", "reason"}),
    Event.DUPLICATE_NODE_ID: frozenset({"election", "term", "holder", "instance"}),
    Event.TERM_REFUSED: frozenset({"election", "term", "high_water"}),
    Event.LISTEN_DOWN: frozenset({"reason", "failures"}),
    Event.LISTEN_UP: frozenset({"failures"}),
    Event.CHILD_STARTED: frozenset({"election", "pid", "term"}),
    Event.CHILD_STOPPING: frozenset({"pid", "reason"}),
    Event.CHILD_STOPPED: frozenset({"pid", "status"}),
    Event.CHILD_EXITED: frozenset({"status"}),
    Event.CHILD_FAILED: frozenset({"reason"}),
    Event.CONTAINMENT: frozenset({"mode"}),
    Event.KEEPER_DIED: frozenset({"pid", "status", "reason"}),
    Event.KEEPER_UNRESPONSIVE: frozenset({"pid"}),
}


def extra(event: Event, **fields: Any) -> dict[str, Any]:
    """The ``extra=`` of a log call for ``event``; only its declared fields are allowed."""
    undeclared = set(fields) - FIELDS[event]
    if undeclared:
        raise ValueError(f"log event {event} has no field(s) {sorted(undeclared)}")
    return {"event": event.value, **fields}
