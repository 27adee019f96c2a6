#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine; idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
command -v curl >/dev/null || missing+=(curl)
# The suite starts its own PostgreSQL server with initdb/pg_ctl.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v runuser >/dev/null || missing+=(util-linux)
# tests/backends/postgres/test_clock_step.py steps the test server's clock with libfaketime.
ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || missing+=(libfaketime)
# Half-closing clients (printf ... | socat - UNIX-CONNECT:...) in tests/api.
command -v socat >/dev/null || missing+=(socat)
# The benchmark's smoke test compares against etcdctl elect on a real etcd.
command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# tests/backends/kubernetes: the real kube-apiserver and a client-go elector, built with Go from the
# Go module proxy; cached, so a second run builds nothing (docs/kubernetes.md gives the cost).
bash tests/backends/kubernetes/build.sh >/dev/null
# Packaging, systemd-analyze, hadolint, kubernetes-validate for tests/deploy.
bash .ci/install-deploy-tools.sh

PYTHON="${PYTHON:-python3}"
"$PYTHON" -m pip install -q --disable-pip-version-check -e '.[test]'
