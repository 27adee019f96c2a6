"""The structure rules, enforced: module and function size, the driver boundary, the
direction of imports, and docs that cite only what the repository holds
(docs/architecture.md, "Rules the suite enforces").

Read from the source text with ``ast``: nothing here imports leaderd.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "leaderd"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# Modules still over the limit, each at its size when the limit was set: they may shrink,
# never grow, and leave this table when they fit (docs/architecture.md, "What is still big").
OVERSIZED: dict[str, int] = {}

# Which modules may import a database or HTTP-client driver: each backend's own modules, so
# no driver exception can leave a backend by a path its error boundary does not cover.
DRIVERS: dict[str, re.Pattern[str]] = {
    "asyncpg": re.compile(r"^leaderd/backends/postgres/[^/]+\.py$"),
    "aiosqlite": re.compile(r"^leaderd/backends/sqlite/[^/]+\.py$"),
    "sqlite3": re.compile(r"^leaderd/backends/sqlite/[^/]+\.py$"),
}
# The layers, lowest first: a module imports only its own layer, the layers below it, and
# the foundation modules at the top of the package (clock, events, held_logs, jsonio,
# package_files).
# So a backend knows no policy, and the election knows nothing of HTTP or of run --.
LAYERS = ("backends", "election", "supervision", "api", "startup")


def modules() -> Iterator[Path]:
    yield from sorted(PACKAGE.rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> Iterator[str]:
    """Absolute names of the modules ``path`` imports at module level (not under
    TYPE_CHECKING, not inside functions: those cannot make an import cycle at start-up)."""
    tree = ast.parse(path.read_text())
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in tree.body:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            stem = ".".join([*base, node.module] if node.module else base)
            yield stem
            yield from (f"{stem}.{alias.name}" for alias in node.names)


def test_no_module_over_the_limit() -> None:
    too_long = {}
    for path in modules():
        lines = len(path.read_text().splitlines())
        allowed = OVERSIZED.get(rel(path), MAX_MODULE_LINES)
        if lines > allowed:
            too_long[rel(path)] = (lines, allowed)
    assert not too_long, f"modules over their limit (lines, limit): {too_long}"


def test_oversized_table_names_only_modules_still_over_the_limit() -> None:
    for name in OVERSIZED:
        path = ROOT / name
        assert path.exists(), f"{name} is gone: remove it from OVERSIZED"
        lines = len(path.read_text().splitlines())
        assert lines > MAX_MODULE_LINES, f"{name} fits now ({lines}): remove it from OVERSIZED"


def test_no_function_over_the_limit() -> None:
    too_long = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{rel(path)}:{node.name} ({lines})")
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines: {too_long}"


@pytest.mark.parametrize("driver", sorted(DRIVERS))
def test_drivers_are_imported_only_inside_their_backend(driver: str) -> None:
    outside = [
        rel(path)
        for path in modules()
        if any(name.split(".")[0] == driver for name in imported(path))
        and not DRIVERS[driver].search(rel(path))
    ]
    assert not outside, f"{driver} imported outside its backend: {outside}"


def layer_of(name: str) -> int | None:
    parts = name.split(".")
    if parts[0] != "leaderd" or len(parts) < 2:
        return None
    if parts[1] in ("__init__", "__main__"):  # the entry points sit above every layer
        return len(LAYERS)
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else None


def test_layers_import_only_downwards() -> None:
    offending = []
    for path in modules():
        own = layer_of(
            module_name(path) if path.name != "__init__.py" else f"{module_name(path)}.__init__"
        )
        for name in imported(path):
            theirs = layer_of(name)
            if theirs is not None and (own is None or theirs > own):
                offending.append(f"{rel(path)} imports {name}")
    assert not offending, offending


def test_every_module_is_in_a_layer_or_the_foundation() -> None:
    foundation = {"__init__", "__main__", "clock", "events", "held_logs", "jsonio", "package_files"}
    loose = [rel(p) for p in PACKAGE.glob("*.py") if p.stem not in foundation]
    assert not loose, f"modules outside the layers: {loose} (docs/architecture.md, the map)"


def test_no_import_cycles() -> None:
    names = {module_name(path): path for path in modules()}
    graph = {
        name: {dep for dep in imported(path) if dep in names and dep != name}
        for name, path in names.items()
    }
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_nothing_cites_a_document_the_repository_does_not_hold() -> None:
    places = ["leaderd", "docs", "packaging", "examples", "bench", "tests", "README.md"]
    citing = []
    for place in places:
        root = ROOT / place
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file() and path != Path(__file__).resolve() and _cites_design(path):
                citing.append(rel(path))
    assert not citing, f"these cite a design document the repository does not hold: {citing}"


def _cites_design(path: Path) -> bool:
    try:
        text = path.read_text()
    except (UnicodeDecodeError, OSError):
        return False
    return re.search(r"DESIGN( ?§| rule|\.md|'s)", text) is not None


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None
