"""leaderd: a leader election sidecar daemon."""

# First: a stop signal during the imports must wait for the daemon, not kill it mid-import.
from .startup import early_signals as _early_signals

_early_signals.block_at_launch()

__version__ = "0.1.0"
