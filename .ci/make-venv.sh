#!/usr/bin/env bash
# Creates the project's virtual environment ($VENV, default .venv) with $SYSTEM_PYTHON.
# On Debian and Ubuntu `python3 -m venv` needs the python3-venv package: installed here when
# missing (as root, or with sudo when it asks no password); otherwise one line says what to run.
set -euo pipefail
cd "$(dirname "$0")/.."
SYSTEM_PYTHON="${SYSTEM_PYTHON:-python3}"
VENV="${VENV:-.venv}"

if "$SYSTEM_PYTHON" -m venv "$VENV" 2>/dev/null; then exit 0; fi
rm -rf "$VENV"
version=$("$SYSTEM_PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
packages="python3-venv python${version}-venv"
if [ "$(id -u)" -eq 0 ]; then SUDO=""
elif sudo -n true 2>/dev/null; then SUDO="sudo -n"
else
  echo "make: '$SYSTEM_PYTHON -m venv' failed; install the venv module first: sudo apt-get install $packages" >&2
  exit 2
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# python3.X-venv exists on Debian 12 and Ubuntu; python3-venv alone pulls the default version's.
$SUDO apt-get install -y -qq --no-install-recommends $packages >/dev/null 2>&1 \
  || $SUDO apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
"$SYSTEM_PYTHON" -m venv "$VENV"
