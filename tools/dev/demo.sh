#!/usr/bin/env bash
# `make demo`: the whole path on this machine, then everything put back.
#   1. hostd discovers this host and plans the carve (demo policy: CPU 0 for the
#      resident IO service, CPU 1 for VMs, 128 x 2 MiB pages, loop disks only)
#   2. a stand-in IO service starts; hostd carves the host for real
#   3. libvirtd, the scheduler (SQLite) and hostd (mTLS gRPC) start; hostd registers
#   4. a VM is POSTed to the scheduler: placed, dispatched, booted (smoke guest,
#      vCPU pinned, hugepage RAM, a loop device as raw disk with an IO throttle)
#   5. kvm-utils profiles vm-exits (of a tiny KVM guest: guests under TCG make none)
#   6. the VM is deleted
#   7. fleet-rollout rolls a new policy (more hugepages) over this host and 3 simulated
#      hosts (real hostd processes on generated trees): one simulated host's IO signal
#      degrades once it is carved, its gate fails, and it is rolled back
#   8. daemons stopped (by PID), the carve undone
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
PY=.venv/bin/python
HOSTD=(.venv/bin/hostd)
STATE=$(mktemp -d /tmp/hyb-demo.XXXXXX)
chmod 0755 "$STATE"   # QEMU (libvirt-qemu) must reach VM files under hostd's state dir
PIDS=()
LOOP=""
CARVED=""
VM_ID=""
SPORT=18700
HPORT=17443
API="https://127.0.0.1:$SPORT"
ADMIN_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
HOST_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
api() { curl -sS --cacert "$STATE/tls/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" -H 'Content-Type: application/json' "$@"; }

cleanup() {
  set +e
  if [ -n "$VM_ID" ]; then
    say "cleanup: DELETE the VM"; api -X DELETE "$API/v1/vms/$VM_ID" -o /dev/null -w 'HTTP %{http_code}\n'
    for _ in $(seq 60); do [ "$(api -o /dev/null -w '%{http_code}' "$API/v1/vms/$VM_ID")" = 404 ] && break; sleep 1; done
  fi
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do
    kill "${PIDS[$i]}" 2>/dev/null && wait "${PIDS[$i]}" 2>/dev/null
  done
  bash tools/dev/libvirtd-ctl.sh stop "$STATE/libvirtd" 2>/dev/null
  if [ -n "$CARVED" ]; then say "cleanup: hostd uncarve"; "${HOSTD[@]}" uncarve --state-dir "$STATE"; fi
  [ -n "$LOOP" ] && losetup -d "$LOOP"
  rm -rf "$STATE"
}
trap cleanup EXIT

if [ "$(id -u)" -ne 0 ]; then echo "make demo carves this host: run it as root" >&2; exit 1; fi

say "a loop device as the raw disk VMs may get (the allow-list names loop* only)"
truncate -s 256M "$STATE/disk.img"
LOOP=$(losetup --find --show "$STATE/disk.img")
echo "$LOOP"
sed "s/^allow = .*/allow = [\"$(basename "$LOOP")\"]/" tools/dev/demo-policy.toml > "$STATE/policy.toml"

say "hostd discover (virt_type=qemu: this machine's /dev/kvm cannot boot a full guest)"
"${HOSTD[@]}" discover --virt-type qemu --policy "$STATE/policy.toml"

say "hostd plan"
"${HOSTD[@]}" plan --virt-type qemu --policy "$STATE/policy.toml"

say "stand-in for the resident IO service, then hostd carve"
$PY -m tools.dev.io_service_standin --dir "$STATE" --tag ossd-standin &
PIDS+=($!)
sleep 0.5
echo "stand-in pid ${PIDS[0]}, CPUs before: $(grep Cpus_allowed_list /proc/${PIDS[0]}/status | cut -f2)"
CARVED=1
"${HOSTD[@]}" carve --virt-type qemu --policy "$STATE/policy.toml" --state-dir "$STATE" | tail -n 12
echo "stand-in CPUs after carve: $(grep Cpus_allowed_list /proc/${PIDS[0]}/status | cut -f2)"
echo "node0 2 MiB pool: $(cat /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages) pages"

say "libvirtd (after the carve: it finds hugetlbfs mounts only at start)"
bash tools/dev/libvirtd-ctl.sh start "$STATE/libvirtd"

say "the smoke guest image (Debian cloud kernel + busybox initramfs), registered with hostd"
bash guestimages/smoke/build.sh /var/cache/hybrid-kvm/smoke
SMOKE=/var/cache/hybrid-kvm/smoke
HOSTD_IMAGE_DIR="$STATE/images" "${HOSTD[@]}" image add smoke --kernel $SMOKE/vmlinuz \
  --initrd $SMOKE/initrd.img --cmdline "console=ttyS0 panic=-1"

say "scheduler on SQLite, hostd with mTLS (dev CA from tools/dev/make-dev-ca.sh)"
DEV_CA_CLIENTS=fleet-rollout bash tools/dev/make-dev-ca.sh "$STATE/tls" >/dev/null
sha() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
cat > "$STATE/scheduler.toml" <<EOF
log_level = "WARNING"
[server]
host = "127.0.0.1"
port = $SPORT
tls_cert = "$STATE/tls/scheduler-api.crt"
tls_key = "$STATE/tls/scheduler-api.key"
[db]
url = "sqlite:///$STATE/scheduler.db"
[dispatch]
ca = "$STATE/tls/ca.crt"
cert = "$STATE/tls/scheduler.crt"
key = "$STATE/tls/scheduler.key"
server_name = "localhost"
[reconcile]
interval_s = 5
[[auth.tokens]]
name = "demo-admin"
sha256 = "$(sha "$ADMIN_TOKEN")"
scopes = ["admin"]
[[auth.tokens]]
name = "demo-hostd"
sha256 = "$(sha "$HOST_TOKEN")"
scopes = ["host"]
EOF
printf '%s' "$HOST_TOKEN" > "$STATE/host.token"
printf '%s' "$ADMIN_TOKEN" > "$STATE/admin.token"
cat > "$STATE/hostd.toml" <<EOF
virt_type = "qemu"
policy = "$STATE/policy.toml"
state_dir = "$STATE"
image_dir = "$STATE/images"
listen = "127.0.0.1:$HPORT"
metrics_listen = "127.0.0.1:19743"
tls_cert = "$STATE/tls/hostd.crt"
tls_key = "$STATE/tls/hostd.key"
tls_ca = "$STATE/tls/ca.crt"
lock_guest_memory = false
scheduler_url = "$API"
scheduler_token_file = "$STATE/host.token"
scheduler_ca = "$STATE/tls/ca.crt"
host_name = "demo-host"
advertise_address = "localhost:$HPORT"
heartbeat_s = 2
days_s = 15        # the day so far goes to the scheduler often: the demo ends with hybctl fleet
EOF
.venv/bin/scheduler serve --config "$STATE/scheduler.toml" > "$STATE/scheduler.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do curl -sf --cacert "$STATE/tls/ca.crt" "$API/readyz" >/dev/null && break; sleep 0.2; done
"${HOSTD[@]}" --config "$STATE/hostd.toml" serve > "$STATE/hostd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do [ "$(api -o /dev/null -w '%{http_code}' "$API/v1/hosts/demo-host")" = 200 ] && break; sleep 0.3; done
api "$API/v1/hosts/demo-host" | $PY -c 'import json,sys; h=json.load(sys.stdin); print(json.dumps({k: h[k] for k in h if k in ("name","state","address","nodes")}, indent=1))'
echo "web console: $API/ui  (log in with the admin token: $(cat "$STATE/admin.token"); the dev CA is"
echo "  $STATE/tls/ca.crt; on another machine: ssh -L $SPORT:127.0.0.1:$SPORT this-host)"

say "POST /v1/vms: 1 pinned vCPU, 256 MiB of 2 MiB pages, the loop disk at 8 MiB/s and 300 IOPS"
BODY=$(printf '{"name":"demo-web","vcpus":1,"memory_mib":256,"image":"smoke","disks":[{"disk":"%s","iotune":{"total_bytes_sec":8388608,"total_iops_sec":300}}]}' "$(basename "$LOOP")")
api -X POST "$API/v1/vms" -H "Idempotency-Key: demo-1" -d "$BODY" > "$STATE/vm.json"
VM_ID=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$STATE/vm.json")
echo "accepted: $VM_ID"
for _ in $(seq 120); do
  STATUS=$(api "$API/v1/vms/$VM_ID" | $PY -c 'import json,sys; print(json.load(sys.stdin)["status"])')
  [ "$STATUS" = running ] || [ "$STATUS" = failed ] && break
  sleep 1
done
api "$API/v1/vms/$VM_ID" | $PY -c 'import json,sys; v=json.load(sys.stdin); print(json.dumps({k: v[k] for k in ("status","reason","host","placement")}, indent=1))'
[ "$STATUS" = running ] || { echo "VM did not start"; tail -n 20 "$STATE/hostd.log"; exit 1; }
DOM="demo-web-${VM_ID:0:8}"
for _ in $(seq 180); do grep -q HYB-SMOKE-OK "$STATE/vms/$DOM/console.log" 2>/dev/null && break; sleep 1; done
echo "guest console: $(grep HYB-SMOKE-OK "$STATE/vms/$DOM/console.log" || echo 'no marker yet')"
echo "virsh vcpupin:"; virsh -c qemu:///system vcpupin "$DOM" | sed 's/^/  /'
echo "virsh blkdeviotune (vda):"; virsh -c qemu:///system blkdeviotune "$DOM" vda | grep -E '^total_(bytes|iops)_sec *:' | sed 's/^/  /'

say "kvm-utils: vm-exit profile"
echo "The guest above runs under QEMU TCG (this machine's /dev/kvm cannot boot Linux), so it makes"
echo "no KVM exits. kvm-utils profiles a tiny guest driven through /dev/kvm instead (port IO):"
TINY=$($PY -c 'from tools.kvm_utils.bench import helper_argv; print(" ".join(helper_argv("pio_out", 200000, name="demo-tiny", delay_ms=1500, linger_ms=1000)))')
$TINY > /dev/null &
TINY_PID=$!
PIDS+=($TINY_PID)
.venv/bin/kvm-utils exits 3 || true
wait "$TINY_PID" 2>/dev/null || true
.venv/bin/kvm-utils doctor || true

say "DELETE /v1/vms/$VM_ID"
api -X DELETE "$API/v1/vms/$VM_ID" -o /dev/null -w 'HTTP %{http_code}\n'
for _ in $(seq 60); do [ "$(api -o /dev/null -w '%{http_code}' "$API/v1/vms/$VM_ID")" = 404 ] && break; sleep 1; done
VM_ID=""
echo "domains left: $(virsh -c qemu:///system list --all --name | grep -c . || true)"
echo "host CPUs used by VMs: $(api "$API/v1/hosts/demo-host" | $PY -c 'import json,sys; print(json.load(sys.stdin)["nodes"][0]["used_cpus"])')"
say "fleet-rollout: a new policy (160 x 2 MiB pages) over this host and 3 simulated hosts"
echo "The simulated hosts are real hostd processes on generated host trees (tools/dev/fleetsim.py);"
echo "the last one's IO signal degrades the moment it is carved (a scrubber on its IO CPU)."
$PY -m tools.dev.simhosts "$STATE/sim" 3 "$API" "$STATE/host.token" "$STATE/admin.token" \
  "$STATE/tls" > "$STATE/simhosts.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 600); do [ -f "$STATE/sim/ready" ] && break; sleep 0.2; done
[ -f "$STATE/sim/ready" ] || { echo "simulated hosts did not start"; tail -n 20 "$STATE/simhosts.log"; exit 1; }
sed 's/^count_per_node = 128 .*/count_per_node = 160/' "$STATE/policy.toml" > "$STATE/policy-v2.toml"
cat > "$STATE/rollout.toml" <<EOF
name = "demo-more-pages"
kind = "policy"            # carved or not, hosts get policy-v2.toml; a failed one gets its old carve back
policy = "policy-v2.toml"
[waves]
canary = 1                 # this host (its rack "" sorts first), then the rest
percent = [100]
max_failures = [0, 1]
[limits]
concurrency = 4
per_rack = 1
unreachable_s = 10
[steps]
baseline_s = 5
soak_s = 8
[gate]
min_samples = 4
alpha = 0.05
controls = 0               # a real machine and simulated trees are not alike: each against itself
psi_rise_pct = 200
psi_some_avg10_max = 60       # v1 host: PSI is the whole host's, VMs and all
foreign_cpu_max = 0.5
EOF
export FLEET_ROLLOUT_SCHEDULER_URL="$API" \
  FLEET_ROLLOUT_TOKEN_FILE="$STATE/admin.token" FLEET_ROLLOUT_SCHEDULER_CA="$STATE/tls/ca.crt" \
  FLEET_ROLLOUT_TLS_DIR="$STATE/tls"
.venv/bin/fleet-rollout plan "$STATE/rollout.toml"
.venv/bin/fleet-rollout run "$STATE/rollout.toml"
echo "node0 2 MiB pool on this host now: $(cat /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages) pages"

say "hybctl: the fleet as an operator sees it (a context in $STATE/hybctl.yaml)"
export HYBCTL_CONFIG="$STATE/hybctl.yaml"
.venv/bin/hybctl config set-context demo --server "$API" --token-file "$STATE/admin.token" \
  --ca "$STATE/tls/ca.crt" --use
.venv/bin/hybctl host list
.venv/bin/hybctl rollout status demo-more-pages
echo "\$ hybctl fleet --window 0-24 --by state   (host-local hours so far today; the peak window is 21:00-22:00)"
.venv/bin/hybctl fleet --window 0-24 --by state
if [ -t 0 ]; then
  echo
  echo "The console is up at $API/ui (admin token: $ADMIN_TOKEN). Press Enter to clean up."
  read -r _
fi

say "done; cleanup stops the daemons it started and uncarves the host"
