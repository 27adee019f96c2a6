"""The chaos marker: long runs of real daemons under faults (deselect with -m "not chaos")."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: chaos harness runs (about a minute each)")
