#!/usr/bin/env bash
# Make a container base image from Debian's own packages, for building the leaderd image
# where no container registry can be reached (air-gapped hosts, this project's CI):
#
#   packaging/debian-base-image.sh [IMAGE] [-- PODMAN-GLOBAL-OPTION...]
#   podman build --build-arg BASE=localhost/leaderd-base:bookworm -t leaderd .
#
# IMAGE defaults to localhost/leaderd-base:bookworm. Options after `--` go to every
# podman call (e.g. --root DIR --storage-driver vfs). Nothing is done when IMAGE exists.
# debootstrap --variant=minbase bookworm with python3 and python3-venv (the venv module
# and the pip wheel ensurepip installs, which the Dockerfile's builder stage uses), then
# `podman import`. Needs root, debootstrap and podman; the mirror is $DEBIAN_MIRROR.
set -euo pipefail

image="${1:-localhost/leaderd-base:bookworm}"
shift || true
if [ "${1:-}" = "--" ]; then shift; fi
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if podman "$@" image exists "$image"; then
  exit 0
fi
work="$(mktemp -d "${TMPDIR:-/var/tmp}/leaderd-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv bookworm "$work/root" "$mirror" \
  >"$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
# What an image never needs: package caches and lists, documentation, translations
# (as in Debian's own slim images, locale.alias stays).
rm -rf "$work/root/var/cache/apt/"*.bin "$work/root/var/cache/apt/archives/"*.deb \
  "$work/root/var/lib/apt/lists/"* "$work/root/usr/share/doc/"* "$work/root/usr/share/man/"* \
  "$work/root/usr/share/info/"*
find "$work/root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
tar --numeric-owner -C "$work/root" -c . \
  | podman "$@" import --change 'CMD ["/usr/bin/python3"]' - "$image" >/dev/null
echo "made $image from Debian bookworm ($mirror)"
