"""Every test file or directory the docs and build files name exists: a moved or renamed
test must take its citations along (docs/architecture.md, "Where a test goes")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITING = ["README.md", "Makefile", "pyproject.toml", "docs/*.md", ".ci/*"]
# A path under tests/, not the tail of another path (~/.cache/leaderd-tests/...).
CITATION = re.compile(r"(?<![\w./~-])tests/[\w./-]*[\w/]")


def _cited() -> dict[str, set[str]]:
    cited: dict[str, set[str]] = {}
    for pattern in CITING:
        for path in sorted(ROOT.glob(pattern)):
            for match in CITATION.finditer(path.read_text()):
                cited.setdefault(match.group(0).rstrip("/"), set()).add(str(path.relative_to(ROOT)))
    return cited


def _exists(cited: str) -> bool:
    # "tests/backends/test_contract" names the contract's modules by their common prefix.
    where = ROOT / cited
    return where.exists() or any(where.parent.glob(where.name + "*"))


def test_the_scan_finds_citations() -> None:
    assert len(_cited()) > 50  # an empty scan would pass the test below


def test_every_cited_test_path_exists() -> None:
    missing = {path: sorted(by) for path, by in _cited().items() if not _exists(path)}
    assert not missing, f"cited but not in the repository: {missing}"
