"""What every /leader answer carries, field by field, for the API tests to check."""

from __future__ import annotations

import datetime as dt
from typing import Any

from .conftest import ADDRESS, FAST

STATUS_FIELDS = {
    "election",
    "node_id",
    "role",
    "is_leader",
    "leader",
    "term",
    "lease",
    "revision",
    "changed_at",
}


def parse_time(text: str) -> dt.datetime:
    assert text.endswith("Z") and len(text) == len("2026-11-21T10:00:00.123Z"), text
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def check_leader_status(body: dict[str, Any], election: str, node_id: str = "node-a") -> None:
    assert set(body) == STATUS_FIELDS
    assert body["election"] == election
    assert body["node_id"] == node_id
    assert body["role"] == "leader"
    assert body["is_leader"] is True
    assert body["leader"]["node_id"] == node_id
    assert body["leader"]["address"] == ADDRESS
    assert body["leader"]["term"] == body["term"] >= 1
    parse_time(body["leader"]["acquired_at"])
    assert body["lease"]["ttl_ms"] == 3000
    assert 0 < body["lease"]["valid_for_ms"] <= FAST.lease_window * 1000
    assert body["revision"] >= 1
    parse_time(body["changed_at"])
