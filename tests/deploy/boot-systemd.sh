#!/bin/bash
# PID 1 of fresh mount, PID, network, UTS and IPC namespaces (started by
# test_systemd_boot.py through `unshare --fork --kill-child`): builds a throwaway
# root and boots the real systemd in it.
#
# The root is an overlay whose lower layer is the host's / and whose upper layer
# is a tmpfs, so nothing systemd does at boot (tmpfiles wiping /tmp, sysusers,
# units writing /var) reaches the host's files. /proc/sys and /sys are read-only
# and the network namespace is empty, so neither kernel settings nor interfaces
# change. Never boot systemd on the host's own root: its tmpfiles service wipes
# the host's /tmp.
set -euo pipefail
base="$1"     # holds stage/ (files to add to the root), and receives layer/ and root/
# A tree stacked over the host's / in the lower layer: the test's stand-in for the host's files.
host="${2:-}"
mount --make-rprivate /
mkdir -p "$base/layer" "$base/root"
mount -t tmpfs tmpfs "$base/layer"
mkdir -p "$base/layer/upper" "$base/layer/work"
lower="/"
if [ -n "$host" ]; then
  # A layer of its own filesystem: overlayfs refuses a lower layer inside another (ELOOP).
  mkdir -p "$base/layer/host"
  cp -a "$host/." "$base/layer/host/"
  lower="$base/layer/host:/"
fi
mount -t overlay overlay \
  -o "lowerdir=$lower,upperdir=$base/layer/upper,workdir=$base/layer/work" "$base/root"
r="$base/root"
mount -t proc proc "$r/proc"
mount --bind "$r/proc/sys" "$r/proc/sys"
mount -o remount,bind,ro "$r/proc/sys"
mount -t sysfs -o ro sysfs "$r/sys"
mount --rbind /sys/fs/cgroup "$r/sys/fs/cgroup"
mount --rbind /dev "$r/dev"
mount -t tmpfs tmpfs "$r/run"
mount -t tmpfs tmpfs "$r/tmp"
# The host's own leaderd state must not show through: a lease its `make run` left for this
# host name (the machine's too) would hold off the booted daemon. /run/leaderd is under the
# fresh /run already; the state and configuration directories get fresh empty ones.
for dir in var/lib/leaderd etc/leaderd; do
  mkdir -p "$r/$dir"
  mount -t tmpfs -o mode=0755 tmpfs "$r/$dir"
done
cp -a "$base/stage/." "$r/"
chroot "$r" /bin/systemd-sysusers >/dev/null
# pivot_root, not chroot: the kernel refuses a chrooted process new user namespaces, which
# a real host's services (and leaderd@.service's PID namespace for its job) may create.
mkdir "$r/.host"
cd "$r"
pivot_root . .host
umount -l /.host
exec /usr/bin/env -i container=leaderd-test PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  /lib/systemd/systemd --log-target=console --log-level=notice
