"""Ratios to a peer measured in the same run, trial by trial.

The machine's speed moves from second to second (other work, CPU steal), so an absolute
figure says little; leaderd and its peer (a bare aiohttp server, etcdctl) are measured in
alternating trials, each of leaderd's trials paired with the peer's next to it, and the
figure judged is the median of the pairs' ratios: a burst of load that hits one trial
moves one pair, not the verdict.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Paired:
    """leaderd's value over the peer's, trial by trial."""

    ours: tuple[float, ...]
    peer: tuple[float, ...]

    @property
    def ratios(self) -> list[float]:
        return [o / p for o, p in zip(self.ours, self.peer, strict=True) if p > 0]

    @property
    def median(self) -> float | None:
        ratios = self.ratios
        return statistics.median(ratios) if ratios else None

    def describe(self, unit: str, scale: float = 1.0, digits: int = 0) -> str:
        """``"pairs 0.93x, 0.97x, 1.01x (leaderd 9,100 / 9,800 ...)"``: every pair."""
        pairs = ", ".join(
            f"{o * scale:,.{digits}f}/{p * scale:,.{digits}f}"
            for o, p in zip(self.ours, self.peer, strict=True)
        )
        ratios = ", ".join(f"{r:.2f}x" for r in self.ratios)
        return f"pairs {ratios} (leaderd/aiohttp {unit}: {pairs})"


def alternate(rounds: int) -> Sequence[bool]:
    """Which runs first in each round (True: leaderd): ABBAABBA..., so neither one always
    follows the other (a warm cache, a load burst that fades)."""
    return [i % 2 == 0 for i in range(rounds)]
