"""Start-up: the command line, configuration, limits, early signals, the daemon."""
