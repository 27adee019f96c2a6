"""One clock for leadership (docs/algorithm.md): no module of leaderd but leaderd/clock.py
reads a clock of its own. Every time that feeds a leadership decision (deadlines, lease,
spare and member ages, back-offs that gate a claim) comes from clock.py, on CLOCK_BOOTTIME;
an age taken on CLOCK_MONOTONIC stops while the host is suspended, and a spare lease or a
member that etcd expired meanwhile looks fresh. Found by reading the source, so it is fast."""

from __future__ import annotations

import ast
from pathlib import Path

import leaderd

PACKAGE = Path(leaderd.__file__).parent
# The module that reads the clocks, for everyone else.
CLOCK_MODULE = PACKAGE / "clock.py"
# time's functions that read a clock: each is a way around the rule.
READERS = {
    "monotonic", "monotonic_ns", "time", "time_ns", "perf_counter", "perf_counter_ns",
    "clock_gettime", "clock_gettime_ns",
}  # fmt: skip
# (module, reader) -> why it may read that clock itself. Every other use goes through
# clock.py (a request's own timeout too: one clock leaves no age on the wrong one).
ALLOWED: dict[tuple[str, str], str] = {
    ("supervision/containment.py", "time.clock_gettime"): (
        "the keeper runs as `python -I -S` with its own two modules only, so it cannot "
        "import clock.py; it reads CLOCK_BOOTTIME itself, the same clock"
    ),
}


def clock_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) of every clock read outside clock.py: time.<reader>, a reader imported
    from time, and loop.time() (the event loop's clock is CLOCK_MONOTONIC)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "time":
            found += [(node.lineno, f"from time import {a.name}") for a in node.names]
        elif (what := _read(node)) is not None:
            found.append((node.lineno, what))
    return found


def _read(node: ast.AST) -> str | None:
    """time.<reader>, or <anything but time>.time() (a loop's clock)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"time.{node.attr}" if node.value.id == "time" and node.attr in READERS else None
    if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, ast.Attribute):
        return None
    func = node.func
    of_time = isinstance(func.value, ast.Name) and func.value.id == "time"
    return f"{ast.unparse(func)}()" if func.attr == "time" and not of_time else None


def test_no_module_but_clock_py_reads_a_clock() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == CLOCK_MODULE:
            continue
        module, source = str(path.relative_to(PACKAGE)), path.read_text()
        lines = source.splitlines()
        for line, what in clock_reads(source):
            boottime = "CLOCK_BOOTTIME" in lines[line - 1]  # an allowed reader reads only it
            if (module, what) not in ALLOWED or not boottime:
                offenders.append(f"leaderd/{module}:{line}: {what}")
    assert not offenders, "read the time from leaderd/clock.py instead:\n" + "\n".join(offenders)


def test_the_rule_finds_every_way_around_it() -> None:
    source = """
import time
from time import monotonic
a = time.monotonic()
b = time.time() + loop.time() + asyncio.get_running_loop().time()
c = time.perf_counter() - time.clock_gettime(time.CLOCK_MONOTONIC)
d = time.sleep(0) or clock.boottime() or dt.datetime.now().time(1)
"""
    assert sorted(clock_reads(source)) == [
        (3, "from time import monotonic"),
        (4, "time.monotonic"),
        (5, "asyncio.get_running_loop().time()"),
        (5, "loop.time()"),
        (5, "time.time"),
        (6, "time.clock_gettime"),
        (6, "time.perf_counter"),
    ]
