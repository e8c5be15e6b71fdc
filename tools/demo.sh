#!/usr/bin/env bash
# `make demo`: this host discovered, planned and carved for real, then restored.
# (Placing and booting a guest through the scheduler arrives with issues 3-4.)
set -euo pipefail
cd "$(dirname "$0")/.."
HOSTD=(.venv/bin/hostd)
POLICY=tools/demo/demo-policy.toml
STATE=$(mktemp -d /tmp/hyb-demo.XXXXXX)
STANDIN_PID=""

cleanup() {
  set +e
  if [ -f "$STATE/carve-journal.json" ]; then
    echo; echo "== hostd uncarve (cleanup)"; "${HOSTD[@]}" uncarve --state-dir "$STATE"
  fi
  [ -n "$STANDIN_PID" ] && kill "$STANDIN_PID" 2>/dev/null && wait "$STANDIN_PID" 2>/dev/null
  rm -rf "$STATE"
}
trap cleanup EXIT

echo "== hostd discover (virt_type=qemu: this machine's /dev/kvm cannot boot a full guest)"
"${HOSTD[@]}" discover --virt-type qemu --policy "$POLICY"

echo; echo "== hostd plan --policy $POLICY"
"${HOSTD[@]}" plan --virt-type qemu --policy "$POLICY"

echo; echo "== starting a stand-in for the resident IO service"
.venv/bin/python -m tools.io_service_standin --dir "$STATE" &
STANDIN_PID=$!
sleep 0.5
echo "stand-in pid $STANDIN_PID, CPUs before: $(grep Cpus_allowed_list /proc/$STANDIN_PID/status | cut -f2)"

echo; echo "== hostd carve --dry-run"
"${HOSTD[@]}" carve --virt-type qemu --policy "$POLICY" --state-dir "$STATE" --dry-run | tail -n 12

echo; echo "== hostd carve"
"${HOSTD[@]}" carve --virt-type qemu --policy "$POLICY" --state-dir "$STATE" | tail -n 12
echo "stand-in CPUs after carve: $(grep Cpus_allowed_list /proc/$STANDIN_PID/status | cut -f2)"
echo "node0 2 MiB pool: $(cat /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages) pages"

echo; echo "== hostd uncarve"
"${HOSTD[@]}" uncarve --state-dir "$STATE"
echo "stand-in CPUs after uncarve: $(grep Cpus_allowed_list /proc/$STANDIN_PID/status | cut -f2)"
echo "node0 2 MiB pool: $(cat /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages) pages"
