"""The random exploration of each world, as CI runs it and as long runs repeat it.

Every fault kind is in: host suspends, answers served from a cache, releases held until
after their sender renewed, lost answers, pauses, partitions and late wake-ups. ``known``
is kept for the command line's sake and changes nothing.
"""

from __future__ import annotations

import dataclasses

from .etcdclient import EtcdWorld
from .network import FAULTS
from .rowstore import RowWorld
from .scheduler import Plan, Report, WorldOf, run

WORLDS: dict[str, WorldOf] = {"row": RowWorld, "etcd": EtcdWorld}


def plan(world: str, seed: int, steps: int, known: bool = False) -> Plan:
    # Releases held until after their sender renewed: often, a release in doubt has a rule.
    faults = dataclasses.replace(FAULTS, stalled_release=0.25)
    return Plan(WORLDS[world], seed, steps, faults, suspends=True)


def exploration(world: str, seed: int, steps: int, known: bool = False) -> Report:
    return run(plan(world, seed, steps, known))
