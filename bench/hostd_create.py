#!/usr/bin/env python3
"""bench/hostd_create: what hostd adds on top of libvirt when it creates a VM.

    .venv/bin/python bench/hostd_create.py [--runs 5]      (root; starts what it needs)

Each run, alternating:
  hostd     CreateVM over mTLS gRPC to a running `hostd serve` (ledger claim, live disk
            re-check, XML design, define, start, record) until the call returns RUNNING
  baseline  libvirt createXML of the very XML hostd defined (same domain, same host),
            until it returns (domain running): what `virsh create` does
Prints the medians, hostd's added time, and the ratio hostd/baseline.
Target (issue 3): hostd adds under 20 % or under 150 ms.

Uses the smoke guest (guestimages/smoke), 2 MiB hugepages and a loop device as raw
disk, like the integration tests; everything it starts or changes is undone at the
end (libvirtd only if it started it, by PID).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import libvirt

from api import hostd_pb2 as pb
from api import hostd_pb2_grpc as pb_grpc
from hostd.apply.images import ImageStore

REPO = Path(__file__).resolve().parents[1]

POOL = Path("/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages")
PAGES = 128


def sh(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/hostd_create needs root (hugepages, loop devices, libvirtd)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hyb-bench-", dir="/var/tmp"))
    work.chmod(0o755)
    undo: list = []
    try:
        return run(args.runs, work, undo)
    finally:
        for fn in reversed(undo):
            try:
                fn()
            except Exception as e:  # keep undoing
                print(f"cleanup: {e}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)


def run(runs: int, work: Path, undo: list) -> int:
    before = POOL.read_text().strip()
    undo.append(lambda: POOL.write_text(before))
    POOL.write_text(str(int(before) + PAGES))
    mnt = Path("/dev/hugepages")
    if "hugetlbfs" not in Path("/proc/mounts").read_text():
        mnt.mkdir(exist_ok=True)
        sh("mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "hugetlbfs", str(mnt))
        undo.append(lambda: sh("umount", str(mnt)))
    sh("bash", str(REPO / "tools/dev/libvirtd-ctl.sh"), "start", str(work / "libvirtd"))
    undo.append(lambda: subprocess.run(["bash", str(REPO / "tools/dev/libvirtd-ctl.sh"), "stop",
                                        str(work / "libvirtd")]))
    img = work / "disk.img"
    with open(img, "wb") as f:
        f.truncate(256 * 2**20)
    loop = sh("losetup", "--find", "--show", str(img)).stdout.strip()
    undo.append(lambda: sh("losetup", "-d", loop))
    smoke = Path("/var/cache/hybrid-kvm/smoke")
    sh("bash", str(REPO / "guestimages/smoke/build.sh"), str(smoke))
    ImageStore(work / "images").add("smoke", "1", "kernel",
                                    {"kernel": smoke / "vmlinuz", "initrd": smoke / "initrd.img"},
                                    cmdline="console=ttyS0 panic=-1")
    sh("bash", str(REPO / "tools/dev/make-dev-ca.sh"), str(work / "tls"))
    (work / "policy.toml").write_text(f"""[io_service]
cpus = "0"
[[hugepages.pools]]
size = "2M"
count_per_node = {PAGES}
[hugepages]
io_floor_percent = 5
[disks]
allow = ["{Path(loop).name}"]
""")
    (work / "hostd.toml").write_text(f"""virt_type = "qemu"
policy = "{work / 'policy.toml'}"
state_dir = "{work / 'state'}"
image_dir = "{work / 'images'}"
listen = "127.0.0.1:0"
metrics_listen = ""
tls_cert = "{work / 'tls/hostd.crt'}"
tls_key = "{work / 'tls/hostd.key'}"
tls_ca = "{work / 'tls/ca.crt'}"
lock_guest_memory = false
""")
    ready = work / "ready"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTD_")}
    with open(work / "hostd.log", "w") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "hostd.cli", "--config", str(work / "hostd.toml"), "serve",
                                 "--ready-file", str(ready)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop_hostd() -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
    undo.append(stop_hostd)
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            print((work / "hostd.log").read_text()[-2000:], file=sys.stderr)
            return 1
        time.sleep(0.1)
    port = int(ready.read_text().split()[1])
    creds = grpc.ssl_channel_credentials((work / "tls/ca.crt").read_bytes(), (work / "tls/scheduler.key").read_bytes(),
                                         (work / "tls/scheduler.crt").read_bytes())
    ch = grpc.secure_channel(f"localhost:{port}", creds)
    undo.append(ch.close)
    stub = pb_grpc.HostdStub(ch)
    conn = libvirt.open("qemu:///system")
    undo.append(conn.close)

    hostd_s: list[float] = []
    base_s: list[float] = []
    for i in range(runs + 1):  # run 0 warms caches (QEMU binary, kernel pages); not counted
        req = pb.CreateVMRequest(request_id=f"bench-{i}", name="hyb-bench-vm", vcpus=1, memory_mib=256,
                                 image="smoke", disks=[pb.DiskRequest(disk=Path(loop).name, iotune=pb.IoTune(
                                     total_bytes_sec=8 * 2**20, total_iops_sec=300))])
        t0 = time.perf_counter()
        vm = stub.CreateVM(req, timeout=120)
        t_h = time.perf_counter() - t0
        xml = conn.lookupByUUIDString(vm.vm_id).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        stub.DeleteVM(pb.DeleteVMRequest(vm_id=vm.vm_id), timeout=60)
        xml = re.sub(r"<uuid>[^<]*</uuid>", f"<uuid>{uuid.uuid4()}</uuid>", xml)
        xml = xml.replace("<name>hyb-bench-vm</name>", "<name>hyb-bench-base</name>")
        t0 = time.perf_counter()
        dom = conn.createXML(xml, 0)
        t_b = time.perf_counter() - t0
        dom.destroy()
        if i:
            hostd_s.append(t_h)
            base_s.append(t_b)
        print(f"run {i}{' (warm-up)' if not i else ''}: hostd CreateVM {t_h * 1000:7.1f} ms   "
              f"libvirt createXML {t_b * 1000:7.1f} ms", flush=True)
    h, b = statistics.median(hostd_s), statistics.median(base_s)
    added = h - b
    print(f"\nmedian of {runs}: hostd {h * 1000:.1f} ms, baseline (libvirt createXML of the same XML) "
          f"{b * 1000:.1f} ms")
    print(f"hostd adds {added * 1000:.1f} ms; ratio hostd/baseline = {h / b:.3f}")
    ok = added < 0.150 or h / b < 1.20
    print(f"target (adds < 20 % or < 150 ms): {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
