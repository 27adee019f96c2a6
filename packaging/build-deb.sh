#!/usr/bin/env bash
# Build the leaderd .deb with Debian's own Python tooling (debhelper, dh-python,
# pybuild-plugin-pyproject): copies the tracked tree to a temporary directory,
# puts packaging/debian/ at its top and runs dpkg-buildpackage -b -us -uc.
#
#   packaging/build-deb.sh [OUTDIR]     (default: dist/)
#
# Build dependencies: .ci/install-deploy-tools.sh installs them.
set -euo pipefail

top="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
outdir="$(mkdir -p "${1:-$top/dist}" && cd "${1:-$top/dist}" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/leaderd-deb.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# The files git tracks plus new ones it does not ignore, as in the work tree;
# a plain copy when this is not a git checkout.
src="$work/leaderd"
mkdir -p "$src"
if git -C "$top" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$top" ls-files -z --cached --others --exclude-standard \
    | (cd "$top" && xargs -0 cp --parents -t "$src" 2>/dev/null || true)
else
  cp -a "$top/." "$src/"
fi
rm -rf "$src/debian"
cp -a "$top/packaging/debian" "$src/debian"

# Debian's python3 and tools only: an interpreter earlier on PATH (pyenv, a
# virtualenv) must not be the one pybuild builds with.
cd "$src"
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$work" LANG=C.UTF-8 \
  DEB_BUILD_OPTIONS="nocheck ${DEB_BUILD_OPTIONS:-}" \
  dpkg-buildpackage -b -us -uc

mv "$work"/*.deb "$outdir"/
ls -1 "$outdir"/*.deb
