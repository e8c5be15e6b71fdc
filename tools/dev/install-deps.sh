#!/usr/bin/env bash
# Install the system packages the project needs (Debian 12), only those missing.
# Idempotent: a second run with everything present does no network access.
set -euo pipefail

PKGS=(
  libvirt-daemon-system libvirt-clients libvirt-dev pkg-config
  libxml2-utils  # xmllint, which virt-xml-validate (libvirt-clients) runs; only Recommended
  qemu-system-x86 qemu-utils
  bpftrace linux-perf
  mmdebstrap umockdev
  postgresql
  cpio xz-utils
  python3-venv python3-dev gcc make util-linux procps iproute2 e2fsprogs openssl curl
  lvm2  # pvcreate: the disk-safety tests write a real LVM PV label on a loop device
  prometheus  # promtool: the IO-health alert rules are checked and unit-tested (hostd/alerts/)
  rt-tests fio stress-ng  # bench/isolation.py: wake-up latency, IO latency, the neighbours
  wrk  # bench/fleet_pulse.py: heartbeats at the fleet's rate from a compiled generator
  chromium chromium-driver  # the console's browser tests (tests/console/), headless
  # kernel-patches/check: Debian's pinned kernel source and what its build needs
  linux-source-6.1 bc bison flex libssl-dev libelf-dev git perl
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing Debian packages: ${missing[*]}" >&2
  echo "install-deps: run as root (or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# No daemons are started by package scripts here (no systemd / policy-rc.d);
# the project's own scripts start libvirtd and PostgreSQL when they need them.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
