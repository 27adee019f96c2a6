"""memory.trim gives freed heap pages back: measured in a fresh process on this libc."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.daemons import REPO

FRAGMENTED = """
import json
from leaderd.startup import memory

def anon_kb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

# 60 MB of 2 KB blocks (malloc'd on the heap, not mmapped), every 50th kept: the freed
# pages sit between live blocks, where only malloc_trim returns them.
blocks = [bytearray(2048) for _ in range(30_000)]
kept = blocks[::50]
del blocks
before = anon_kb()
trimmed = memory.trim()
print(json.dumps({"trimmed": trimmed, "freed_kb": before - anon_kb(), "kept": len(kept)}))
"""


def test_trim_returns_freed_heap_pages() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FRAGMENTED],
        env={"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(out.stdout)
    assert seen["trimmed"] is True
    assert seen["freed_kb"] > 20_000, seen
