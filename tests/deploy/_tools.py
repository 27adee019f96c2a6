"""Helpers for the deployment checks: find the real tools, run them, fail loudly.

A missing tool is a failure that names the install step, never a silent skip:
these tests exist to prove the artefacts pass the tool each ecosystem uses.
"""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL_HINT = "run .ci/install-deploy-tools.sh"
# The pinned, hashed requirements the image installs (packaging/lock.sh writes them).
IMAGE_LOCKS = ("packaging/requirements.lock", "packaging/build.lock")


def require(tool: str) -> str:
    """The path of `tool` on PATH (or beside this Python), else fail with the install step."""
    found = shutil.which(tool) or shutil.which(tool, path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail(f"{tool} is not installed: {INSTALL_HINT}", pytrace=False)
    return found


def require_module(module: str) -> None:
    """Fail unless `python -m module` can run in this interpreter."""
    probe = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.fail(f"Python module {module} is missing: {INSTALL_HINT}", pytrace=False)


def run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    timeout: float = 300,
    check: bool = True,
    **kwargs: object,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure the assertion shows the command and all it printed."""
    done = subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,  # type: ignore[call-overload]
    )
    if check:
        assert done.returncode == 0, (
            f"{' '.join(map(str, cmd))} exited {done.returncode}\n"
            f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )
    return done


# The build context's top-level files (with the package, leaderd/): what .dockerignore lets in.
CONTEXT_FILES = ("pyproject.toml", "README.md", "LICENSE", *IMAGE_LOCKS)
# Builds kept between runs, keyed by their inputs (as tests/backends/kubernetes/build.sh does).
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "leaderd-tests"


def source_copy(dest: Path) -> Path:
    """What a build needs (the Docker build context): pyproject, README, the package."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "packaging").mkdir(exist_ok=True)
    for name in CONTEXT_FILES:
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "leaderd", dest / "leaderd", ignore=ignore)
    return dest


def context_digest(*more: str) -> str:
    """A key for a build from the Dockerfile and its context: the Dockerfile, every file of the
    context (names and bytes) and ``more`` (a base image's id, the interpreter's version)."""
    digest = hashlib.sha256()
    package = sorted(p for p in (ROOT / "leaderd").rglob("*") if p.is_file())
    files = [ROOT / "Dockerfile", *(ROOT / name for name in CONTEXT_FILES), *package]
    for path in files:
        if "__pycache__" in path.parts or path.suffix == ".pyc" or not path.exists():
            continue
        digest.update(f"{path.relative_to(ROOT)}\0".encode() + path.read_bytes() + b"\0")
    for word in more:
        digest.update(word.encode() + b"\0")
    return digest.hexdigest()[:16]


def project_version() -> str:
    """leaderd.__version__, read from the source (the wheel's dynamic version)."""
    # Read, not run: the package's first lines act on the process (stop signals).
    tree = ast.parse((ROOT / "leaderd" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__version__":
            return str(ast.literal_eval(node.value))
    raise AssertionError("leaderd/__init__.py sets no __version__")


def default_shutdown_timeout() -> float:
    """The daemon's default shutdown_timeout, as its configuration loader computes it."""
    from leaderd.startup.config import load

    empty = ROOT / "packaging" / "leaderd.toml"  # every line commented: all defaults
    return load({}, env={}, file=str(empty)).shutdown_timeout


def unit_settings(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit as {section: {key: [values in order]}} (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(value: str) -> float:
    """A systemd time span such as '15s', '1min 30s' or '90', in seconds."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    total = 0.0
    for part in value.split():
        number = part.rstrip("abcdefghijklmnopqrstuvwxyz")
        total += float(number) * units.get(part[len(number) :] or "s", 0)
    return total


def pyproject() -> dict[str, object]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)
