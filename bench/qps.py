"""Backend queries per second per node at steady state, with the default timing.

Two daemons per backend (a leader and a follower), all backends at once (they are idle,
so they do not disturb each other). After a warm-up, the request count of the
`leaderd_backend_request_seconds` histogram is read at the start and at the end of the
window. Waiting for a change (LISTEN, `PRAGMA data_version` ticks, a blocked
`pg_advisory_lock` counts as one request per round) is not a request: see the notes.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from .common import DEFAULT_TIMING, Backends, Figure, cluster
from .unix_http import backend_requests

SIZE = 2
MAX_QPS = 1.0  # issue 3: at most one query per second per node with the default timing
NOTES = {
    "sqlite": "followers also read PRAGMA data_version every 3 ms (shared memory, not counted)",
    "postgresql": "standbys LISTEN between rounds (no queries)",
    "postgresql+advisory": "a standby's round is one blocking pg_advisory_lock",
    "postgresql+advisory:immediate": "a standby's round is one blocking pg_advisory_lock",
}


async def _per_node(url: str, warmup: float, window: float) -> dict[str, Any]:
    async with cluster(url, SIZE, DEFAULT_TIMING, "q") as group:
        leader = await group.settled()
        await asyncio.sleep(warmup)
        before = {d.node_id: await backend_requests(d.socket) for d in group.daemons}
        await asyncio.sleep(window)
        after = {d.node_id: await backend_requests(d.socket) for d in group.daemons}
        still = await group.settled()
    nodes = {}
    for d in group.daemons:
        ops = {op: after[d.node_id][op] - before[d.node_id].get(op, 0.0) for op in after[d.node_id]}
        role = "leader" if d is leader else "follower"
        nodes[role] = {"node": d.node_id, "qps": ops["total"] / window, "requests": ops}
    return {"nodes": nodes, "stable_leader": still is leader, "window": window}


async def measure(
    group: Backends, names: list[str], warmup: float, window: float
) -> tuple[list[Figure], dict[str, Any]]:
    jobs = {name: _per_node(group.url(name), warmup, window) for name in names}
    results = await asyncio.gather(*jobs.values(), return_exceptions=True)
    figures, data = [], {}
    for name, result in zip(jobs, results, strict=True):
        if isinstance(result, BaseException):
            figures.append(Figure("qps", name, "backend queries/s", None, "q/s", note=repr(result)))
            continue
        data[name] = result
        for role in ("leader", "follower"):
            node = result["nodes"][role]
            ops = ", ".join(
                f"{op} {n:g}" for op, n in sorted(node["requests"].items()) if op != "total" and n
            )
            note = f"{ops or 'none'} in {window:g} s"
            if role == "follower":
                note += f"; {NOTES[name]}"
            figures.append(
                Figure(
                    "qps",
                    name,
                    f"backend queries/s, {role}",
                    node["qps"],
                    "q/s",
                    f"<= {MAX_QPS:g} q/s",
                    node["qps"] <= MAX_QPS,
                    note=note,
                )
            )
    return figures, {"timing": dataclasses.asdict(DEFAULT_TIMING), "backends": data}
