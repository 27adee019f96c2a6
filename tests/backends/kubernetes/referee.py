"""A referee over leaderd daemons and client-go electors campaigning for one Lease.

The daemons' /leader answers are judged as tests/support/referee.py judges them (terms order their
tenures). An elector has no leaderd term, so its tenures are spans instead (electors.py:
from reading its "leading" line to the earlier of its SIGTERM and reading "stopped"), inside
which it surely led; a daemon's "leader" answer whose whole request lies inside such a span
proves two leaders at one instant.
"""

from __future__ import annotations

from collections.abc import Sequence

from tests.support.chaos.check import Claim
from tests.support.daemons import Daemon, wait_for
from tests.support.kube_electors import Elector
from tests.support.referee import Referee


class MixedReferee(Referee):
    def __init__(self, daemons: Sequence[Daemon], electors: Sequence[Elector]) -> None:
        super().__init__(daemons)
        self.electors = electors

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        overlaps = [
            (c, e.identity, span)
            for e in self.electors
            for span in e.leading()
            for c in self.claims
            if span[0] <= c.sent and c.received <= span[1]
        ]
        assert not overlaps, f"a daemon led while client-go led: {overlaps[:3]}"

    def led(self, node: str) -> list[Claim]:
        return [c for c in self.claims if c.node == node]

    def wait_seen(self, daemon: Daemon, timeout: float = 10.0) -> None:
        """Until this referee has seen ``daemon`` lead: its poll of a frozen daemon waits out a
        2 s timeout, so it may trail the test."""
        wait_for(lambda: self.led(daemon.node_id), timeout=timeout,
                 what=f"the referee to see {daemon.node_id} lead")  # fmt: skip
