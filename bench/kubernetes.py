"""leaderd on kubernetes:// next to client-go's own elector, in one run on one real control
plane (tests/support/kube_cluster.py): graceful hand-over (SIGTERM the leader) and crash
failover (SIGKILL it), three candidates each.

    python -m bench.kubernetes --handovers 20 --failovers 8

leaderd is measured as bench/handover.py measures every backend (the first follower's
/watch naming the new leader). An elector is measured from the signal to the moment its
successor's "leading" line is read. Hand-over runs both at their defaults (leaderd 15/5/2 s,
client-go 15/10/2 s); crash failover at a 2 s lease (leaderd 2/0.5/0.25 s, client-go
2/1.5/0.25 s: LeaseDuration/RenewDeadline/RetryPeriod).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tests.support.kube_cluster import NAMESPACE, ControlPlane
from tests.support.kube_electors import Elector

from .common import DEFAULT_TIMING, SHORT_TIMING, ms, summary
from .handover import measure

SIZE = 3
CLIENT_GO_DEFAULT = ("15s", "10s", "2s")
CLIENT_GO_SHORT = ("2s", "1500ms", "250ms")


def _leading(elector: Elector) -> bool:
    """Its last transition says it leads."""
    return [line for line in elector.lines if line in ("leading", "stopped")][-1:] == ["leading"]


async def _until(what: str, timeout: float, check: Any, electors: Any = ()) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            seen = {e.identity: e.lines for e in electors}
            raise RuntimeError(f"timed out waiting for {what}: {seen}")
        await asyncio.sleep(0.005)
    return found


def _successor(others: list[Elector], before: dict[str, int]) -> float | None:
    """When another elector's new "leading" line was read; None before it is."""
    for e in others:
        if e.lines.count("leading") > before[e.identity]:
            return e.read_at[len(e.lines) - 1 - e.lines[::-1].index("leading")]
    return None


def _following(elector: Elector) -> bool:
    return any(line.startswith("leader ") for line in elector.lines)


async def client_go(
    kube: ControlPlane, count: int, signum: int, timing: tuple[str, str, str], workdir: Path
) -> dict[str, Any]:
    """Seconds from the signal to the successor's "leading" line, ``count`` times."""
    lease = f"bench-cg-{uuid.uuid4().hex[:8]}"
    electors = {f"cg-{i}": Elector(kube, lease, f"cg-{i}", workdir, timing) for i in range(SIZE)}
    samples = []
    try:
        for _ in range(count):
            leader = await _until(
                "an elector to lead",
                60,
                lambda: next((e for e in electors.values() if _leading(e)), None),
            )
            others = [e for e in electors.values() if e is not leader]
            before = {e.identity: e.lines.count("leading") for e in others}
            t0 = time.monotonic()
            leader.proc.send_signal(signum)

            successor = functools.partial(_successor, others, before)
            found = await _until("a successor", 120, successor, electors.values())
            samples.append(found - t0)
            await asyncio.to_thread(leader.wait_exit)
            again = Elector(kube, lease, leader.identity, workdir, timing)
            electors[leader.identity] = again
            await _until(
                "the restarted elector to follow",
                60,
                functools.partial(_following, again),
            )
    finally:
        for e in electors.values():
            e.stop()
    return {"first": summary(samples), "samples": samples, "timing": timing, "electors": SIZE}


async def run(handovers: int, failovers: int) -> dict[str, Any]:
    kube = ControlPlane()
    workdir = Path(tempfile.mkdtemp(prefix="ldb-kube-"))
    try:
        config = kube.restricted.kubeconfig(str(workdir / "restricted.kubeconfig"))
        url = f"kubernetes:///{NAMESPACE}?kubeconfig={config}"
        return {
            "leaderd": {
                "handover": await measure(
                    "kubernetes", url, handovers, signal.SIGTERM, DEFAULT_TIMING
                ),
                "failover": await measure(
                    "kubernetes", url, failovers, signal.SIGKILL, SHORT_TIMING
                ),
            },
            "client-go": {
                "handover": await client_go(
                    kube, handovers, signal.SIGTERM, CLIENT_GO_DEFAULT, workdir
                ),
                "failover": await client_go(
                    kube, failovers, signal.SIGKILL, CLIENT_GO_SHORT, workdir
                ),
            },
        }
    finally:
        kube.cleanup()


def table(results: dict[str, Any]) -> str:
    rows = [
        "| | hand-over p50 | p99 | max | crash failover p50 | p99 | max |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for who, data in results.items():
        h, f = data["handover"]["first"], data["failover"]["first"]
        rows.append(
            f"| {who} | {ms(h['p50']):.1f} ms | {ms(h['p99']):.1f} ms | "
            f"{ms(h['max']):.1f} ms | {ms(f['p50']):.0f} ms | {ms(f['p99']):.0f} ms | "
            f"{ms(f['max']):.0f} ms |"
        )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--handovers", type=int, default=20)
    p.add_argument("--failovers", type=int, default=8)
    p.add_argument("--json", metavar="FILE", help="also write every sample here")
    args = p.parse_args()
    results = asyncio.run(run(args.handovers, args.failovers))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    print(table(results))
    print(f"(n = {args.handovers} hand-overs, {args.failovers} failovers each; pid {os.getpid()})")


if __name__ == "__main__":
    main()
