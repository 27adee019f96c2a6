"""Election timing and the rules that make it safe: rejected, never repaired.

The rules are listed at the top of docs/algorithm.md.
"""

from __future__ import annotations

from dataclasses import dataclass


class TimingError(ValueError):
    """Timing that cannot be safe; the message is one line naming the rule."""


@dataclass(frozen=True, slots=True)
class Timing:
    ttl: float = 15.0
    renew_interval: float = 5.0
    retry_interval: float = 2.0
    # Largest relative rate difference between two hosts' clocks that we tolerate.
    clock_drift: float = 0.01
    # Subtracted from every deadline: covers answering, scheduling and child kill latency.
    safety_margin: float = 0.2

    @property
    def lease_window(self) -> float:
        """How long after sending a successful request this node may call itself leader."""
        return self.ttl * (1.0 - self.clock_drift) - self.safety_margin

    def validate(self, election: str = "default") -> None:
        where = f"election {election}: "
        if not self.retry_interval > 0:
            raise TimingError(f"{where}retry_interval must be > 0 (got {self.retry_interval:g})")
        if not self.renew_interval >= self.retry_interval:
            raise TimingError(
                f"{where}renew_interval ({self.renew_interval:g}s) must be >= retry_interval "
                f"({self.retry_interval:g}s)"
            )
        if not self.ttl > self.renew_interval * 2:
            raise TimingError(
                f"{where}ttl ({self.ttl:g}s) must be greater than renew_interval * 2 "
                f"({self.renew_interval * 2:g}s)"
            )
        if not 0 <= self.clock_drift < 0.1:
            raise TimingError(f"{where}clock_drift must be in [0, 0.1) (got {self.clock_drift:g})")
        if not self.safety_margin >= 0:
            raise TimingError(f"{where}safety_margin must be >= 0 (got {self.safety_margin:g})")
        if not self.lease_window > self.renew_interval:
            raise TimingError(
                f"{where}ttl * (1 - clock_drift) - safety_margin ({self.lease_window:g}s) must "
                f"exceed renew_interval ({self.renew_interval:g}s), or no renewal fits in a lease"
            )
