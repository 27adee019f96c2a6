"""The bench smoke tests' marker, registered here so the suite's settings stay untouched."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "bench: a very small run of the benchmark (bench/)")
