"""The Dockerfile: hadolint, its shape, and its install steps replayed without an engine.

The builder stage's RUN lines are run as they are written, in a fresh virtualenv, with
the image's paths (/src, /build, /wheels, /opt/leaderd) moved into a temporary directory:
a quick check that the wheel the image installs builds and runs. test_image.py builds the
image itself and runs it with podman.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from ._tools import (
    CACHE,
    IMAGE_LOCKS,
    ROOT,
    context_digest,
    project_version,
    require,
    run,
    source_copy,
)

# The container recipe's build step has its own 600 s timeout.
pytestmark = [pytest.mark.deploy, pytest.mark.timeout(900)]

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[int, str, str]]:
    """(stage number, INSTRUCTION, arguments) with continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result, stage = [], -1
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            stage += 1
        result.append((stage, word.upper(), rest.strip()))
    return result


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last = max(stage for stage, _, _ in steps)
    return [(word, rest) for stage, word, rest in steps if stage == last]


def test_hadolint_passes() -> None:
    hadolint = require("hadolint")
    done = run([hadolint, "--no-color", DOCKERFILE], check=False)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_hadolint_reports_a_bad_dockerfile(tmp_path: Path) -> None:
    """The check above can fail: an unpinned apt-get install is reported."""
    hadolint = require("hadolint")
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text() + "RUN apt-get update && apt-get install gcc\n")
    done = run([hadolint, "--no-color", bad], check=False)
    assert done.returncode != 0 and "DL3008" in done.stdout, done.stdout


def test_final_stage_is_small_non_root_and_stops_on_sigterm() -> None:
    steps = final_stage()
    words = dict(steps)  # the last of each instruction
    # Both stages start from the build argument BASE, whose default is the slim image.
    assert words["FROM"] == "${BASE}"
    base = [rest for stage, word, rest in instructions() if stage == -1 and word == "ARG"]
    assert base == ["BASE=python:3.11-slim-bookworm"], base
    user = words["USER"].split(":")[0]
    assert user.isdigit() and int(user) != 0, "USER must be numeric for runAsNonRoot"
    assert json.loads(words["ENTRYPOINT"]) == ["leaderd"]
    assert words["STOPSIGNAL"] == "SIGTERM"
    assert "/run/leaderd" in json.loads(words["VOLUME"])
    runs = " ".join(rest for word, rest in steps if word == "RUN")
    for tool in ("apt-get", "gcc", "build-essential", "pip install"):
        assert tool not in runs, f"final stage runs {tool}"
    copies = [rest for word, rest in steps if word == "COPY"]
    assert copies == ["--from=builder /opt/leaderd /opt/leaderd"], copies


def test_dockerignore_keeps_the_context_to_what_the_wheel_needs() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in lines and "!leaderd/" in lines and "!pyproject.toml" in lines


@pytest.fixture(scope="module")
def image_venv() -> Path:
    """The builder stage's RUN lines, run here; returns the virtualenv they made. Kept between
    runs under the digest of the Dockerfile, its context and this interpreter: a change to any
    of them runs the lines again. A virtualenv names its own path, so it is made in place."""
    base = CACHE / "image-venv" / context_digest(sys.version, sys.executable)
    base.parent.mkdir(parents=True, exist_ok=True)
    done = base / "done"
    with open(base.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs at once replay the lines once
        if not done.exists():
            shutil.rmtree(base, ignore_errors=True)  # what an interrupted run left
            replay_builder(base)
            done.touch()
        for other in base.parent.iterdir():  # other contexts' ones, a day unused
            if other.is_dir() and other != base and time.time() - other.stat().st_mtime > 86400:
                shutil.rmtree(other, ignore_errors=True)
    os.utime(base)
    return base / "venv"


def replay_builder(base: Path) -> None:
    """Run the builder stage's RUN lines with the image's paths moved below ``base``."""
    base.mkdir(parents=True)
    # The build context: what .dockerignore lets through.
    src = source_copy(base / "src")
    paths = {
        "/src": src, "/build": base / "build", "/wheels": base / "wheels",
        "/opt/leaderd": base / "venv",
    }  # fmt: skip
    builder = [rest for stage, word, rest in instructions() if stage == 0 and word == "RUN"]
    assert builder, "the builder stage has no RUN lines"
    # `python` in the image is CPython 3.11; here it is this interpreter.
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(base),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
    }
    for command in builder:
        for image_path, here in paths.items():
            command = re.sub(rf"{re.escape(image_path)}(?=[/ ]|$)", str(here), command)
        run(["bash", "-euo", "pipefail", "-c", command], env=env, cwd=src, timeout=600)


def test_image_install_builds_one_leaderd_wheel(image_venv: Path) -> None:
    wheels = list((image_venv.parent / "wheels").glob("leaderd-*.whl"))
    assert [w.name for w in wheels] == [f"leaderd-{project_version()}-py3-none-any.whl"]


def test_image_venv_runs_leaderd_version(image_venv: Path) -> None:
    done = run([image_venv / "bin" / "leaderd", "--version"], env={"PATH": "/usr/bin:/bin"})
    assert done.stdout.strip() == f"leaderd {project_version()}"


def test_image_venv_has_uvloop_and_no_pip(image_venv: Path) -> None:
    python = image_venv / "bin" / "python"
    run([python, "-c", "import uvloop, asyncpg, aiosqlite, aiohttp, orjson, prometheus_client"])
    pip = subprocess.run([python, "-m", "pip", "--version"], capture_output=True)
    assert pip.returncode != 0, "pip must not be left in the image's virtualenv"


def test_image_venv_daemon_checks_its_config(image_venv: Path, tmp_path: Path) -> None:
    """The installed daemon imports its backends and reads a configuration."""
    done = run(
        [image_venv / "bin" / "leaderd", "check-config", "--backend", "static://"],
        env={"PATH": "/usr/bin:/bin", "STATE_DIRECTORY": str(tmp_path),
             "RUNTIME_DIRECTORY": str(tmp_path), "LEADERD_CONFIG": os.devnull},
    )  # fmt: skip
    assert "config ok" in done.stdout


def locked(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (pinned version, sha256 hashes) of a pip-compile --generate-hashes file."""
    text = re.sub(r"\\\n", " ", path.read_text())
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split(" --hash=")
        name, _, version = requirement.split(";")[0].strip().partition("==")
        found[name.lower()] = (version, [o.strip() for o in options])
    return found


@pytest.mark.parametrize("lock", IMAGE_LOCKS)
def test_image_locks_pin_every_package_with_hashes(lock: str) -> None:
    packages = locked(ROOT / lock)
    assert packages, f"{lock} pins nothing"
    for name, (version, hashes) in packages.items():
        assert re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version), f"{lock}: {name} is not pinned"
        assert hashes and all(h.startswith("sha256:") for h in hashes), f"{lock}: {name}"


def test_image_lock_covers_the_declared_dependencies() -> None:
    """pyproject's dependencies and build requirements are each in their lock (after a
    change there, run packaging/lock.sh)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for names, lock in (
        (project["project"]["dependencies"], "packaging/requirements.lock"),
        (project["build-system"]["requires"], "packaging/build.lock"),
    ):
        wanted = {re.split(r"[<>=;\[ ]", n, maxsplit=1)[0].lower() for n in names}
        assert wanted <= set(locked(ROOT / lock)), (lock, wanted - set(locked(ROOT / lock)))


def test_builder_installs_only_hashed_locked_packages() -> None:
    builder = [rest for stage, word, rest in instructions() if stage == 0 and word == "RUN"]
    pips = [p for rest in builder for p in rest.split("&&") if " pip " in p and "check" not in p]
    for pip in pips:
        if "-r " in pip:
            assert "--require-hashes" in pip, pip
        else:  # leaderd's own wheel, from this source, and nothing it depends on
            assert "--no-deps" in pip, pip
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert all(f"!{lock}" in lines for lock in IMAGE_LOCKS)
