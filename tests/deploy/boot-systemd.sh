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
mount --make-rprivate /
mkdir -p "$base/layer" "$base/root"
mount -t tmpfs tmpfs "$base/layer"
mkdir -p "$base/layer/upper" "$base/layer/work"
mount -t overlay overlay \
  -o "lowerdir=/,upperdir=$base/layer/upper,workdir=$base/layer/work" "$base/root"
r="$base/root"
mount -t proc proc "$r/proc"
mount --bind "$r/proc/sys" "$r/proc/sys"
mount -o remount,bind,ro "$r/proc/sys"
mount -t sysfs -o ro sysfs "$r/sys"
mount --rbind /sys/fs/cgroup "$r/sys/fs/cgroup"
mount --rbind /dev "$r/dev"
mount -t tmpfs tmpfs "$r/run"
mount -t tmpfs tmpfs "$r/tmp"
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
