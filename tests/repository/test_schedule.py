"""The rest lane's order (tests/support/schedule.py): the files it weighs exist, and the
heaviest go first, each file's tests together and in their own order."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

import pytest

from tests.support import schedule


@dataclass
class Item:
    path: str
    name: str


class Config:
    def __init__(self, reorder: bool) -> None:
        self.reorder = reorder

    def getoption(self, name: str, default: Any = None) -> Any:
        return self.reorder if name == "loadscopereorder" else default


def test_every_weighed_file_exists() -> None:
    missing = [p for p in schedule.WEIGHTS if not os.path.isfile(os.path.join(schedule.TESTS, p))]
    assert not missing, f"weighed but not in tests/ (moved? take the weight along): {missing}"


# The two heaviest files, the lighter first, after a file not weighed: the reverse of the order.
LIGHT, HEAVY = sorted(schedule.WEIGHTS, key=schedule.WEIGHTS.__getitem__)[-2:]
COLLECTED = ["unweighed.py", LIGHT, HEAVY]


def ordered(reorder: bool) -> list[tuple[str, str]]:
    items = [Item(os.path.join(schedule.TESTS, p), name) for p in COLLECTED for name in "ab"]
    schedule.pytest_collection_modifyitems(
        cast(pytest.Config, Config(reorder)), cast(list[pytest.Item], items)
    )
    return [(os.path.relpath(i.path, schedule.TESTS), i.name) for i in items]


def test_the_heaviest_files_go_first_and_keep_their_tests_in_order() -> None:
    assert ordered(reorder=False) == [
        (HEAVY, "a"), (HEAVY, "b"), (LIGHT, "a"), (LIGHT, "b"),
        ("unweighed.py", "a"), ("unweighed.py", "b"),
    ]  # fmt: skip


def test_without_no_loadscope_reorder_the_collection_keeps_its_order() -> None:
    assert ordered(reorder=True) == [(p, name) for p in COLLECTED for name in "ab"]
