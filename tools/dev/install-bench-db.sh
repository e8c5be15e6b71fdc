#!/usr/bin/env bash
# Install what bench/atomic_writes.py needs (Debian 12), only what is missing:
# MariaDB's server (mariadbd, mariadb-install-db, the client) and sysbench.
# Not part of `make test`'s path: the bench calls it, or run it by hand.
# Idempotent: with everything present it does no network access and exits 0.
# Package scripts must not start the system MariaDB: the bench runs its own
# instance (own datadir/socket/port); if no policy-rc.d forbids starting
# services, one is put in place for the install and removed after.
set -euo pipefail

PKGS=(mariadb-server mariadb-client sysbench)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "install-bench-db: missing Debian packages: ${missing[*]}" >&2
  echo "install-bench-db: run as root (or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi

policy=/usr/sbin/policy-rc.d
ours=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# install-bench-db: no service starts during the install\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  ours=1
fi
cleanup() { if [ "$ours" = 1 ]; then rm -f "$policy"; fi; }
trap cleanup EXIT

echo "install-bench-db: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
