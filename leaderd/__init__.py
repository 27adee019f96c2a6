"""leaderd: a leader election sidecar daemon."""

__version__ = "0.1.0"
