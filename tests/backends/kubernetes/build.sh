#!/usr/bin/env bash
# Builds the Kubernetes tests' two Go programs from the Go module proxy and prints the
# directory that holds them:
#   kube-apiserver  the real API server, from k8s.io/kubernetes (apiserver/go.mod pins it)
#   elector         client-go's leaderelection on one Lease (elector/)
# Outputs are cached under ~/.cache/leaderd-tests/kube/VERSION-KEY, KEY a hash of this script
# and both modules' sources: a second run with the same sources builds nothing. The Go module
# and build caches live beside them, so `rm -rf ~/.cache/leaderd-tests/kube` frees all of it
# (after `chmod -R u+w`: Go makes its module cache read-only).
# Environment: LEADERD_KUBE_CACHE (the cache directory), GO (the go command; default: go on
# PATH, else /usr/local/go/bin/go), GOFLAGS (added to, e.g. GOFLAGS=-p=1 on a busy machine).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${LEADERD_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leaderd-tests/kube}"
version="$(sed -nE 's/^(require)?[[:space:]]*k8s\.io\/kubernetes (v[0-9.]+).*/\2/p' "$here/apiserver/go.mod")"
[ -n "$version" ] || { echo "build.sh: no k8s.io/kubernetes version in apiserver/go.mod" >&2; exit 1; }
key="$(cat "$0" "$here"/apiserver/go.mod "$here"/apiserver/go.sum \
  "$here"/elector/go.mod "$here"/elector/go.sum "$here"/elector/*.go | sha256sum | cut -c1-12)"
out="$cache/$version-$key"

built() { [ -x "$out/kube-apiserver" ] && [ -x "$out/elector" ]; }

if built; then
  echo "$out"
  exit 0
fi
mkdir -p "$cache"
# Two test runs starting at once build once: the second waits, then finds the outputs.
exec 9>"$cache/.lock"
flock 9
if built; then
  echo "$out"
  exit 0
fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
if [ ! -x "$GO" ]; then
  echo "build.sh: no Go toolchain (go 1.26 or newer; set GO=/path/to/go)" >&2
  exit 1
fi
export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build"
export GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath -buildvcs=false"
echo "build.sh: building kube-apiserver $version and the client-go elector into $out" >&2
started=$SECONDS
tmp="$out.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
# -s -w: no symbol table or DWARF (the tests never debug the server; the link is faster).
# -X: /version reports the release, as Kubernetes' own build stamps it.
v="k8s.io/component-base/version"
minor="${version#v1.}"
minor="${minor%%.*}"
ldflags="-s -w -X $v.gitVersion=$version -X $v.gitMajor=1 -X $v.gitMinor=$minor"
# The go command's hundreds of "downloading" lines go to a log, shown only on failure.
log="$cache/build.log"
build() {
  (cd "$here/apiserver" &&
    "$GO" build -ldflags="$ldflags" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver) &&
    (cd "$here/elector" && "$GO" build -o "$tmp/elector" .)
}
if ! build >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "build.sh: the build failed; the whole log is $log" >&2
  exit 1
fi
# Outputs of older versions or sources are never used again.
find "$cache" -mindepth 1 -maxdepth 1 -name 'v*' ! -name "$(basename "$tmp")" -exec rm -rf {} +
mv "$tmp" "$out"
echo "build.sh: built in $((SECONDS - started)) s" >&2
echo "$out"
