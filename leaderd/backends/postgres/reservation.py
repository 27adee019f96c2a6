"""The reservation of a released lease for one node id, in both PostgreSQL backends' SQL.

A release may name the node id that alone may acquire the lease for one ttl on the server's
clock (docs/algorithm.md, "Hand-over to a chosen standby"). Both tables keep it in the same
two columns, ``reserved_for`` and ``reserved_until``; every acquisition clears them. Also
the lease a row of either table shows, reservation included.
"""

from __future__ import annotations

from typing import Any

from ..base import Lease
from ..records import Member

# The reservation's columns, added to an older leaderd's table on open.
COLUMNS = {"reserved_for": "text", "reserved_until": "timestamptz"}
# The release's SET clause: $6 the node id ('' for no reservation), $7 its seconds.
RESERVE = (
    "reserved_for = NULLIF($6::text, ''), "
    "reserved_until = now() + make_interval(secs => $7::float8)"
)
# The acquisition's SET clause: whoever acquires ends the reservation.
CLEAR = "reserved_for = NULL, reserved_until = NULL"


def reserved_sql(alias: str, holder: str) -> str:
    """True while the row is reserved for a node id other than ``holder`` (an expression)."""
    return f"coalesce({alias}.reserved_for <> {holder} AND {alias}.reserved_until > now(), false)"


def reservation_sql(alias: str) -> str:
    """The reservation as a lease reports it: its node id and seconds left, while it lasts."""
    lasts = f"{alias}.holder IS NULL AND {alias}.reserved_until > now()"
    return (
        f"CASE WHEN {lasts} THEN {alias}.reserved_for END AS reserved_for, "
        f"CASE WHEN {lasts} THEN extract(epoch FROM {alias}.reserved_until - now())::float8 "
        "END AS reserved_in"
    )


def released_lease(election: str, row: Any, members: tuple[Member, ...] = ()) -> Lease:
    """A released row (no holder): its term, and the reservation while it lasts."""
    term = int(row["term"] or 0)
    reserved_for = row["reserved_for"] or ""
    reserved_in = float(row["reserved_in"] or 0.0) if reserved_for else 0.0
    return Lease(election, None, "", term, None, None, reserved_for=reserved_for,
                 reserved_in=reserved_in, members=members)  # fmt: skip


def lease_from_row(
    election: str, row: Any, expires_in: float | None, members: tuple[Member, ...]
) -> Lease:
    """The lease a row of either table shows; ``expires_in`` as the backend judges it."""
    if row["holder"] is None:
        return released_lease(election, row, members)
    return Lease(election, row["holder"], row["address"], int(row["term"]),
                 row["acquired_at"], expires_in, instance=row["instance"],
                 version=row["version"] or "", members=members)  # fmt: skip
