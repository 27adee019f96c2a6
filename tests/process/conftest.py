"""Process test set-up: a short directory (Unix socket paths stay under 108 bytes)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.support.daemons import short_tempdir


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)
