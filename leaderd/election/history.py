"""GET /history: the election's holders, newest first, as this node last read them from the
backend (docs/api.md, "History"). The engine reads them again whenever the holder changes,
so an answer never queries the backend."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from ..backends.records import HISTORY_RETENTION, Tenure
from .status import format_time

DEFAULT_LIMIT = 20
MAX_LIMIT = HISTORY_RETENTION


@dataclass(frozen=True, slots=True)
class History:
    election: str
    records: tuple[Tenure, ...]
    # When this node last read them (its wall clock); None before the first read.
    read_at: dt.datetime | None

    def to_dict(self, limit: int) -> dict[str, Any]:
        return {
            "election": self.election,
            "read_at": format_time(self.read_at),
            "retention": HISTORY_RETENTION,
            "records": [_record(r) for r in self.records[:limit]],
        }


def _record(r: Tenure) -> dict[str, Any]:
    return {
        "term": r.term,
        "holder": r.holder,
        "instance": r.instance,
        "address": r.address,
        "acquired_at": format_time(r.acquired_at),
        "ended_at": format_time(r.ended_at),
        "end_reason": r.end_reason,
    }
