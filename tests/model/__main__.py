"""Long runs of the model check: ``python -m tests.model --steps N --seed S``.

Runs the random exploration on each world (or the one named) from seed S on, one seed per
``--steps`` steps, until ``--seeds`` seeds ran or a violation is found (exit 1, with the
seed and the story that led to it).
"""

from __future__ import annotations

import argparse
import sys

from .checker import Violation
from .explore import WORLDS, exploration


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.model", description=__doc__)
    parser.add_argument("--steps", type=int, default=50_000, help="loop steps per seed")
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds, from --seed on")
    parser.add_argument("--world", choices=sorted(WORLDS), help="one world only (default: all)")
    known = "include the paths of known faults whose fixes are under way"
    parser.add_argument("--known", action="store_true", help=known)
    args = parser.parse_args(argv)
    worlds = [args.world] if args.world else sorted(WORLDS)
    for seed in range(args.seed, args.seed + args.seeds):
        for world in worlds:
            try:
                report = exploration(world, seed, args.steps, known=args.known)
            except Violation as exc:
                print(f"{world} seed {seed}: VIOLATION {exc}", flush=True)
                return 1
            print(f"{world} {report}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
