#!/usr/bin/env bash
# One libvirtd "host" in its own mount, network and UTS namespace (tools/dev/libvirt_pair.py
# starts two of them for live-migration tests on one machine):
#
#   unshare -m -n -u --propagation private -- tools/dev/libvirtd-ns.sh HOST_DIR NAME [LISTEN_ADDR]
#
# Inside the new namespaces: hostname NAME, loopback up, HOST_DIR/{etc,run,lib,log,cache}
# bound over /etc/libvirt, /run/libvirt, /var/lib/libvirt, /var/log/libvirt and
# /var/cache/libvirt (so the machine's own libvirtd and this one never see each other's
# sockets, domains or caches), a 2 MiB hugetlbfs on HOST_DIR/hugepages, then exec libvirtd
# in the foreground: the PID that unshare was started as is libvirtd's, and the namespaces
# end with the last process in them (libvirtd and the QEMUs it started). The caller writes
# HOST_DIR/etc/libvirtd.conf and qemu.conf first, and links the network namespaces.
set -euo pipefail
dir=${1:?usage: libvirtd-ns.sh HOST_DIR NAME [LISTEN_ADDR]}
name=${2:?usage: libvirtd-ns.sh HOST_DIR NAME [LISTEN_ADDR]}
# LISTEN_ADDR: libvirtd also listens (--listen) on the TLS socket libvirtd.conf names at
# this address (peers' qemu+tls); the caller adds it to the namespace's veth after
# unshare made the namespace, so libvirtd starts once it is there.
listen_addr=${3:-}
# Mounts made here must not leak back into the machine's namespace.
[ "$(readlink /proc/self/ns/mnt)" != "$(readlink /proc/1/ns/mnt)" ] \
  || { echo "libvirtd-ns: not in a private mount namespace (run under unshare -m)" >&2; exit 2; }
hostname "$name"
ip link set lo up
for d in etc:/etc/libvirt run:/run/libvirt lib:/var/lib/libvirt log:/var/log/libvirt cache:/var/cache/libvirt; do
  src=$dir/${d%%:*} dst=${d#*:}
  mkdir -p "$src" "$dst"
  mount --bind "$src" "$dst"
done
mkdir -p "$dir/hugepages"
mount -t hugetlbfs -o pagesize=2M hugetlbfs "$dir/hugepages"
listen=()
if [ -n "$listen_addr" ]; then
  for _ in $(seq 600); do
    ip -o -4 addr show | grep -q " inet $listen_addr/" && break
    sleep 0.05
  done
  ip -o -4 addr show | grep -q " inet $listen_addr/" \
    || { echo "libvirtd-ns: $listen_addr never appeared in this namespace" >&2; exit 3; }
  listen=(--listen)
fi
exec /usr/sbin/libvirtd -f /etc/libvirt/libvirtd.conf -p /run/libvirt/libvirtd.pid "${listen[@]}"
