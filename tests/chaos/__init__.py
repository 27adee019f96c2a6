"""The chaos harness: real leaderd daemons under injected faults, checked from outside.

Run it with ``python -m tests.chaos`` (docs/chaos.md); the harness and the checker's rules
are in tests/support/chaos/.
"""
