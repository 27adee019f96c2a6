#!/usr/bin/env bash
# Regenerate the image's lock files from pyproject.toml: every package pinned to one version
# with the sha256 of each of its files on PyPI, so that the Dockerfile installs the same bytes
# on every build (pip --require-hashes refuses anything else).
#
#   packaging/lock.sh        (needs pip-tools: .venv/bin/pip install pip-tools)
#
# packaging/requirements.lock: what the daemon runs on (the image's virtualenv);
# packaging/build.lock: the build backend that makes leaderd's own wheel (setuptools, wheel).
# Run it with the image's Python (CPython 3.11, Linux) and commit both files; run it again to
# take newer versions (a security fix), then rebuild and test the image.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
common=(--quiet --generate-hashes --no-emit-index-url --no-emit-find-links --strip-extras)
"$PYTHON" -m piptools compile "${common[@]}" --output-file packaging/requirements.lock \
  pyproject.toml
"$PYTHON" -m piptools compile "${common[@]}" --allow-unsafe --all-build-deps \
  --only-build-deps --output-file packaging/build.lock pyproject.toml
