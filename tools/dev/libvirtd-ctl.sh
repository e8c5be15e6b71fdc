#!/usr/bin/env bash
# Start or stop libvirtd + virtlogd on hosts where PID 1 is not systemd (this
# development machine, CI). Real hosts use the distribution's systemd units.
#
#   tools/dev/libvirtd-ctl.sh start STATE_DIR   start what is not running; remember
#                                           in STATE_DIR which daemons we started
#   tools/dev/libvirtd-ctl.sh stop STATE_DIR    stop only the daemons we started (by PID)
#   tools/dev/libvirtd-ctl.sh restart-libvirtd STATE_DIR   restart libvirtd if we started it
#
# Order matters (DESIGN.md): hugetlbfs must be mounted before libvirtd starts,
# since libvirtd looks for hugetlbfs mounts only at start-up.
set -euo pipefail
cmd=${1:?start|stop}
state=${2:?state dir}
mkdir -p "$state"

running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

answering() {  # why (for the message): wait up to 10 s for qemu:///system to answer
  for _ in $(seq 100); do
    virsh -c qemu:///system version >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "libvirtd-ctl: libvirtd is not answering $1" >&2
  return 1
}

start_one() {  # name binary pidfile
  local name=$1 bin=$2 pidfile=$3
  if running "$pidfile"; then return 0; fi
  # A daemon of the same kind that is still exiting (stopped by another test run a
  # moment ago) holds the pidfile's lock: the new one refuses to start; try again.
  for _ in $(seq 20); do
    "$bin" --daemon --pid-file "$pidfile" && break
    sleep 0.25
    if running "$pidfile"; then return 0; fi
  done
  for _ in $(seq 50); do running "$pidfile" && break; sleep 0.1; done
  running "$pidfile" || { echo "libvirtd-ctl: $name did not start" >&2; exit 1; }
  cp "$pidfile" "$state/$name.started"
}

case "$cmd" in
start)
  # What udev's rule would do (KERNEL=="kvm", GROUP="kvm", MODE="0660"); without
  # it libvirt's QEMU user cannot open /dev/kvm, libvirt marks its capability
  # cache stale on every call and re-probes QEMU: 65 s per `virsh create`.
  if [ -c /dev/kvm ] && getent group kvm >/dev/null; then
    chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
  fi
  mkdir -p /run/libvirt
  start_one virtlogd /usr/sbin/virtlogd /run/virtlogd.pid
  start_one libvirtd /usr/sbin/libvirtd /run/libvirtd.pid
  answering "on qemu:///system" || exit 1
  ;;
stop)
  for name in libvirtd virtlogd; do
    f="$state/$name.started"
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$f"
  done
  ;;
restart-libvirtd)
  # Only a libvirtd we started (tests of hostd surviving a libvirtd restart).
  f="$state/libvirtd.started"
  [ -s "$f" ] || { echo "libvirtd-ctl: libvirtd was not started by us; not restarting it" >&2; exit 3; }
  pid=$(cat "$f")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$f"
  start_one libvirtd /usr/sbin/libvirtd /run/libvirtd.pid
  answering "after restart" || exit 1
  ;;
*) echo "usage: $0 start|stop|restart-libvirtd STATE_DIR" >&2; exit 2 ;;
esac
