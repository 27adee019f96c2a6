"""A referee for process tests: polls every daemon's /leader and judges the answers."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from tests.support.chaos.check import Claim, check_safety
from tests.support.daemons import Daemon


class Referee:
    """Polls every daemon's /leader in the background and judges the answers with the chaos
    checker (tests/support/chaos/check.py): a "leader" answer proves leadership only at some instant
    of its request, so only what the answers' times prove is a violation."""

    def __init__(self, daemons: Sequence[Daemon]) -> None:
        self.daemons = daemons
        self.claims: list[Claim] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def terms(self) -> list[int]:
        return [c.term for c in self.claims]

    def __enter__(self) -> Referee:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        found = check_safety(self.claims)
        assert not found.total, f"safety violations: {found.listed[:3]}"

    def _run(self) -> None:
        while not self._stop.is_set():
            for d in self.daemons:
                if d.alive():
                    sent = time.monotonic()
                    code, body = d.get("/leader", timeout=2)
                    if code == 200:
                        self.claims.append(Claim(d.node_id, body["term"], sent, time.monotonic()))
            time.sleep(0.01)
