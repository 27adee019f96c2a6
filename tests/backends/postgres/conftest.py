"""Fixtures shared by the PostgreSQL tests."""

from __future__ import annotations

import pytest

from tests.backends.postgres.helpers import SCHEMES


@pytest.fixture(params=SCHEMES)
def scheme(request: pytest.FixtureRequest) -> str:
    """Each PostgreSQL backend's URL scheme in turn."""
    return str(request.param)
