"""Breaking a SQLite file's holder lock the way an operator might: replace or delete it."""

from __future__ import annotations

import os
from pathlib import Path

from leaderd.backends.sqlite.proof import SUFFIX


def break_holder_lock(db: Path, how: str) -> None:
    """``how``: "replaced" (another file renamed over it) or "deleted"."""
    lock = Path(f"{db}{SUFFIX}")
    if how == "replaced":
        spare = db.parent / "spare-lock"
        spare.write_bytes(b"")
        os.replace(spare, lock)
    else:
        lock.unlink()
