"""python -m tests.chaos [--backend sqlite|postgresql|advisory|etcd|all] [--nodes 5] [--duration S]
[--seed N] [--report out.json] — exit 1 on any violation (docs/chaos.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

import orjson

from tests.support.chaos.etcd import EtcdChaos
from tests.support.chaos.harness import Chaos
from tests.support.chaos.settings import ALL_FAULTS, BACKENDS, Settings
from tests.support.pgserver import PgServer

from .report import table, violations_text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tests.chaos",
        description="Real leaderd daemons under a seeded fault schedule; checks safety and "
        "liveness from outside. Exit 0 without violations, 1 with, 2 on bad usage.",
    )
    p.add_argument(
        "--backend",
        action="append",
        choices=[*BACKENDS, "all"],
        help="repeatable; default: all in turn (sqlite, postgresql, advisory, etcd)",
    )
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="seconds of faults IN TOTAL, split evenly between the backends (default 60)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ttl", type=float, default=1.5)
    p.add_argument("--renew-interval", type=float, default=0.4)
    p.add_argument("--retry-interval", type=float, default=0.2)
    p.add_argument("--poll-interval", type=float, default=0.01, help="per daemon (default 0.01)")
    p.add_argument("--slack", type=float, default=1.5, help="added to ttl + retry_interval")
    p.add_argument(
        "--faults", help=f"comma-separated subset of {','.join(ALL_FAULTS)} (default: all)"
    )
    p.add_argument("--leader-bias", type=float, default=0.7)
    p.add_argument(
        "--supervise",
        action="store_true",
        help="every daemon runs a command (leaderd run -- ...); adds the keeper faults and "
        "the two_commands check",
    )
    p.add_argument("--report", help="write the JSON report here")
    p.add_argument("--keep", action="store_true", help="keep daemon logs even when all is well")
    p.add_argument(
        "--unsafe",
        action="store_true",
        help="run a deliberately broken leaderd (self-fencing off): violations EXPECTED",
    )
    return p


def settings_from(args: argparse.Namespace) -> list[Settings]:
    chosen = args.backend or ["all"]
    backends = list(BACKENDS) if "all" in chosen else list(dict.fromkeys(chosen))
    faults = tuple(k.strip() for k in (args.faults or "").split(",") if k.strip())
    unknown = set(faults) - set(ALL_FAULTS)
    if unknown:
        raise SystemExit(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    return [
        Settings(
            backend=b,
            nodes=args.nodes,
            duration=args.duration / len(backends),
            seed=args.seed,
            ttl=args.ttl,
            renew_interval=args.renew_interval,
            retry_interval=args.retry_interval,
            poll_interval=args.poll_interval,
            slack=args.slack,
            faults=faults,
            leader_bias=args.leader_bias,
            unsafe=args.unsafe,
            keep=args.keep,
            supervise=args.supervise,
        )
        for b in backends
    ]


async def run_all(plans: Sequence[Settings], pg: PgServer | None = None) -> list[dict[str, Any]]:
    """Run each plan in turn; one PostgreSQL server serves every PostgreSQL plan."""
    runs = []
    own = None
    try:
        for s in plans:
            postgres = s.backend not in ("sqlite", "etcd", "kubernetes")
            if postgres and pg is None:
                pg = own = await asyncio.to_thread(PgServer)
            if postgres:
                assert pg is not None
                await asyncio.to_thread(pg.ensure_running)
            what = f"{s.backend}, {s.nodes} nodes, {s.duration:g}s, seed {s.seed}"
            print(f"chaos: {what}", flush=True)
            chaos = chaos_for(s, pg if postgres else None)
            result = await chaos.run()
            runs.append(result.as_dict())
    finally:
        if own is not None:
            await asyncio.to_thread(own.cleanup)
    return runs


def chaos_for(s: Settings, pg: PgServer | None) -> Chaos:
    """The harness for a backend: etcd and kubernetes bring their own servers' faults."""
    if s.backend == "etcd":
        return EtcdChaos(s)
    if s.backend == "kubernetes":
        from tests.support.chaos.kubernetes import KubeChaos

        return KubeChaos(s)
    return Chaos(s, pg)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        plans = settings_from(args)
        for plan in plans:
            plan.kinds()
    except ValueError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    started = time.time()
    try:
        import uvloop

        runs = uvloop.run(run_all(plans))
    except ImportError:
        runs = asyncio.run(run_all(plans))
    total = sum(r["violations"] for r in runs)
    report = {
        "command": ["python", "-m", "tests.chaos", *(argv or sys.argv[1:])],
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "unsafe": args.unsafe,
        "violations": total,
        "faults_injected": sum(r["faults_injected"] for r in runs),
        "runs": runs,
    }
    if args.report:
        with open(args.report, "wb") as f:
            f.write(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print()
    print(table(runs))
    details = violations_text(runs)
    if details:
        print(details)
    print(f"faults injected: {report['faults_injected']}, violations: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
