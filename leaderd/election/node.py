"""This daemon's elections, as the HTTP API, metrics and systemd see them (read-only view)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import __version__
from ..backends.base import Backend
from ..clock import boottime
from .engine import Election
from .status import format_time


@dataclass
class Node:
    node_id: str
    backend: Backend
    elections: dict[str, Election]
    # This node's health checks as /status lists them (supervision/health.py).
    checks: Callable[[], list[dict[str, Any]]] = list
    started_at: float = field(default_factory=boottime)
    started_wall: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    # run --once-per: each election's job, as GET /jobs lists it (api/jobs.py: job_body).
    jobs: dict[str, Callable[[], dict[str, Any]]] = field(default_factory=dict)
    # What still opens before the node can do its work (the record of run --once-per).
    opening: set[str] = field(default_factory=set)

    def election(self, name: str | None) -> Election | None:
        """The named election; with no name, the only one or else the one named default."""
        if name is None:
            if len(self.elections) == 1:
                return next(iter(self.elections.values()))
            name = "default"
        return self.elections.get(name)

    @property
    def ready(self) -> bool:
        """Every election finished its first round, leader or follower alike, and nothing
        is still opening."""
        return not self.opening and all(e.ready for e in self.elections.values())

    def not_ready(self) -> str | None:
        """Why the node is not ready, in one line; None once it is."""
        waiting = [name for name, e in self.elections.items() if not e.ready]
        why = [f"first round not finished: {', '.join(waiting)}"] if waiting else []
        why += [f"still opening {what}" for what in sorted(self.opening)]
        return "; ".join(why) or None

    def health(self) -> str | None:
        """None while every election loop turns; else the first reason it does not."""
        return next((r for e in self.elections.values() if (r := e.health())), None)

    def summary(self) -> str:
        """One line for systemd's STATUS= and logs: each election's role and leader."""
        parts = []
        for status in (e.status() for e in self.elections.values()):
            leader = status.leader.node_id if status.leader else "none"
            role = status.role.value
            parts.append(f"{status.election}: {role} (leader {leader}, term {status.term})")
        return "; ".join(parts)

    def describe(self) -> dict[str, Any]:
        """The body of GET /status."""
        contacts = [e.last_contact for e in self.elections.values() if e.last_contact]
        errors = [e.last_error for e in self.elections.values() if e.last_error]
        return {
            "node_id": self.node_id,
            "version": __version__,
            "uptime_s": round(boottime() - self.started_at, 3),
            "started_at": format_time(self.started_wall),
            "ready": self.ready,
            "health": self.health() or "ok",
            "backend": {
                "kind": self.backend.kind,
                "url": self.backend.description,
                "last_contact": format_time(max(contacts)) if contacts else None,
                "last_error": errors[0] if errors else None,
            },
            "elections": {name: e.status().to_dict() for name, e in self.elections.items()},
            "checks": self.checks(),
        }
