#!/usr/bin/env bash
# A development CA and certificates for mTLS between scheduler and hostd.
#   tools/dev/make-dev-ca.sh DIR [HOSTNAME...]
# writes DIR/ca.{crt,key}, DIR/hostd.{crt,key} and DIR/scheduler-api.{crt,key} (servers:
# hostd's gRPC and the scheduler's HTTPS; SANs: the hostnames given, localhost, 127.0.0.1, ::1;
# hostd's is a client too, for live migration's TLS streams), DIR/scheduler.{crt,key} and DIR/fleet-rollout.{crt,key}
# (clients hostd lets change VMs), plus a client certificate for each name in
# $DEV_CA_CLIENTS (space-separated; tests use it for a caller hostd must refuse).
# Existing files are kept, so re-running is harmless. Not for production: keys are
# unencrypted.
set -euo pipefail
dir=${1:?usage: make-dev-ca.sh DIR [HOSTNAME...]}
shift || true
mkdir -p "$dir"
cd "$dir"
umask 077
days=825

if [ ! -f ca.key ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout ca.key -out ca.crt -days "$days" -subj "/CN=hybrid-kvm dev CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

issue() {  # name, extendedKeyUsage, SAN list
  local name=$1 eku=$2 san=$3
  [ -f "$name.crt" ] && return 0
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$name.key" -out "$name.csr" -subj "/CN=$name" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\nsubjectAltName=%s\n' \
    "$eku" "$san" > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -out "$name.crt" -days "$days" -extfile "$name.ext" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

san="DNS:localhost,IP:127.0.0.1,IP:::1"
for h in "$@"; do san="$san,DNS:$h"; done
issue hostd serverAuth,clientAuth "$san"  # also a client: live migration's TLS streams
issue scheduler-api serverAuth "$san"
issue scheduler clientAuth "DNS:scheduler"
issue fleet-rollout clientAuth "DNS:fleet-rollout"
for c in ${DEV_CA_CLIENTS:-}; do issue "$c" clientAuth "DNS:$c"; done
chmod 0644 ca.crt ./*.crt
echo "dev CA in $dir: ca.crt, hostd.{crt,key} (server), scheduler.{crt,key} and fleet-rollout.{crt,key} (clients)"
