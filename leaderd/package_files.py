"""The package's own data files (openapi.json, config.schema.json), read from beside its
modules.

Not importlib.resources: its import pulls in tempfile, shutil, zipfile, bz2 and lzma, which
the daemon needs for nothing else (docs/benchmarks.md, "Start-up and idle memory"). leaderd is
installed as plain files (wheel, .deb, image), never imported from a zip.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).parent


def read_bytes(name: str) -> bytes:
    return (_HERE / name).read_bytes()
