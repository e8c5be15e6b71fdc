#!/usr/bin/env python3
"""bench/migration: live migration of one carved guest between two hosts, time and downtime.

    .venv/bin/python -m bench.migration [--runs 6] [--bandwidth 64] [--no-tls] [--paths baseline,hostd] [--json]

Two libvirtd hosts on this machine (tools/dev/libvirt_pair.py: each in its own mount,
network and UTS namespace, linked by a veth pair). The smoke guest (guestimages/smoke, its
ticker on) runs with 2 MiB hugepage-backed memory, one pinned vCPU and a throttled raw
loop-device disk; it is moved A->B->A... ``--runs`` times, each move with the target's own
disk, pinning and throttles in its XML.

Paths measured:
  baseline  libvirt alone: ``virsh migrate --live --p2p --copy-storage-all --persistent
            --undefinesource --xml --persistent-xml --migrate-disks vda --auto-converge
            --timeout --bandwidth [--tls]`` (tools/dev/libvirt_pair.py: migrate_argv)

  hostd     hostd on both ends (tools/dev/hostd_pair.py): a `hostd serve` per host with its own
            carve, disk allow-list and state; the guest created by CreateVM on A; each move
            PrepareMigration on the target, MigrateVM on the source (the same flags, cap and
            TLS), CompleteMigration on the target. hostd renders the guest itself (its
            designer's devices, one IO thread per disk), so the guests are alike, not equal.

Printed beside each other with the ratio hostd/baseline of the medians (the issue's target:
within 1.1x).

Per run: the wall time of the migrate command, and libvirt's own figures read on the
target (``virsh domjobinfo --completed``: "Time elapsed" and "Total downtime"; the source
keeps no record once ``--undefinesource`` removed its domain; for hostd, MigrateVM's answer,
libvirt's job-completed figures on the source). Printed: each run, then the
median and p90 of each. Each move also checks that the guest went on (its ticker counts on
with the same boot id on the target). Needs root; everything it starts or changes is
undone at the end (hosts by PID, loop devices, the 2 MiB pool).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.dev.caches import smoke_image
from tools.dev.libvirt_pair import (Host, LibvirtPair, guest_xml, host_serial, job_ms, job_stats, migrate_argv,
                                    retarget_xml)
from tools.dev.procstat import wait_hugepages_free
from tools.dev.schedbench import percentile

POOL = Path("/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages")
NAME = "hyb-mig-bench"
TICK = re.compile(r"^HYB-TICK (\S+) (\d+)\r?$", re.MULTILINE)
# Each host's own pinning and throttles (host -> vCPU/emulator CPU, iotune).
TUNE = {"a": ("0", {"total_bytes_sec": 50 * 2**20, "total_iops_sec": 1000}),
        "b": ("1", {"total_bytes_sec": 20 * 2**20, "total_iops_sec": 500})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: .venv/bin/python -m bench.migration --runs 10 --bandwidth 0 --json")
    ap.add_argument("--runs", type=int, default=6, help="migrations, alternating A->B and B->A (default 6)")
    ap.add_argument("--bandwidth", type=int, default=64, help="cap in MiB/s for memory and disk, 0: none (default 64)")
    ap.add_argument("--memory-mib", type=int, default=128, help="guest memory (default 128)")
    ap.add_argument("--disk-mib", type=int, default=64, help="raw disk size copied over NBD (default 64)")
    ap.add_argument("--no-tls", action="store_true", help="memory and disk streams in clear text")
    ap.add_argument("--boot-timeout", type=float, default=400, help="seconds to the guest's first tick (TCG)")
    ap.add_argument("--paths", default="baseline,hostd", help="what to measure, comma-separated (default both)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    if not set(args.paths) <= {"baseline", "hostd"} or not args.paths:
        ap.error("--paths: baseline, hostd or both")
    if os.geteuid() != 0:
        print("bench/migration needs root (namespaces, hugepages, loop devices, libvirtd)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hyb-bench-mig-", dir="/var/tmp"))
    undo: list = []
    try:
        result = run(args, work, undo)
    finally:
        for fn in reversed(undo):
            try:
                fn()
            except Exception as e:  # keep undoing
                print(f"cleanup: {e}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        report(result)
    return 0


def run(args: argparse.Namespace, work: Path, undo: list) -> dict:
    smoke = smoke_image()
    before = POOL.read_text().strip()
    pages = 2 * args.memory_mib // 2 + 8  # both ends hold the guest's memory during the copy

    def restore_pool() -> None:
        wait_hugepages_free()
        POOL.write_text(before)
    undo.append(restore_pool)
    POOL.write_text(str(int(before) + pages))
    loops = {}
    for h in "ab":
        img = work / f"disk-{h}.img"
        with open(img, "wb") as f:
            f.truncate(args.disk_mib * 2**20)
        loops[h] = subprocess.run(["losetup", "--find", "--show", str(img)], check=True, capture_output=True,
                                  text=True).stdout.strip()
        undo.append(lambda dev=loops[h]: subprocess.run(["losetup", "-d", dev], check=False))

    if "hostd" in args.paths:
        # hostd backs VMs only from a mounted pool; let go once the hosts' QEMUs are gone
        # (tools/dev/hugetlbfs.py: shared with whatever else on this machine holds it)
        from tools.dev.hugetlbfs import held_2m
        held = held_2m()
        held.__enter__()
        undo.append(lambda: held.__exit__(None, None, None))
    tls = not args.no_tls
    pair = LibvirtPair(work / "pair", tls=tls)
    undo.append(pair.stop)
    pair.start()
    result: dict = {"memory_mib": args.memory_mib, "disk_mib": args.disk_mib,
                    "bandwidth_mib_s": args.bandwidth or None, "tls": tls}
    if "baseline" in args.paths:
        runs = run_baseline(args, work, pair, loops, smoke, tls)
        result["baseline"] = {"what": "libvirt alone (virsh migrate)", "runs": runs, "summary": summarize(runs)}
    if "hostd" in args.paths:
        runs = run_hostd(args, work, undo, pair, loops, smoke, tls)
        result["hostd"] = {"what": "hostd on both ends", "runs": runs, "summary": summarize(runs)}
    if "baseline" in result and "hostd" in result:
        result["ratio"] = {k: round(result["hostd"]["summary"][k]["median"]
                                    / result["baseline"]["summary"][k]["median"], 3)
                           for k in ("wall_s", "job_ms", "downtime_ms")}
    return result


def summarize(runs: list[dict]) -> dict:
    return {k: summary([r[k] for r in runs]) for k in ("wall_s", "job_ms", "downtime_ms")}


def run_baseline(args: argparse.Namespace, work: Path, pair: LibvirtPair, loops: dict, smoke: Path,
                 tls: bool) -> list[dict]:
    hosts = {"a": pair.a, "b": pair.b}
    pin, tune = TUNE["a"]
    xml = work / "guest.xml"
    xml.write_text(guest_xml(name=NAME, kernel=smoke / "vmlinuz", initrd=smoke / "initrd.img", disk=Path(loops["a"]),
                             memory_mib=args.memory_mib, vcpu_pin=pin, emulator_pin=pin, iotune=tune))
    pair.a.virsh("define", str(xml))
    pair.a.virsh("start", NAME)
    boot_id, last = wait_tick(pair.a, after=5, timeout=args.boot_timeout)

    runs = []
    src = "a"
    for i in range(args.runs):
        dst = "b" if src == "a" else "a"
        s, d = hosts[src], hosts[dst]
        pin, tune = TUNE[dst]
        target = work / f"target-{i}.xml"
        target.write_text(retarget_xml(s.virsh("dumpxml", "--migratable", NAME).stdout, disk=Path(loops[dst]),
                                       vcpu_pin=pin, emulator_pin=pin, iotune=tune))
        t0 = time.monotonic()
        s.virsh(*migrate_argv(NAME, target, d, bandwidth_mib=args.bandwidth or None, tls=tls), timeout=900)
        wall = time.monotonic() - t0
        stats = job_stats(d.virsh("domjobinfo", "--completed", NAME).stdout)
        last_src = max(n for b, n in ticks(s) if b == boot_id)
        boot, last = wait_tick(d, after=max(last, last_src), timeout=120)
        if boot != boot_id:
            raise RuntimeError(f"run {i}: the guest rebooted on {d.name} (boot id {boot}, was {boot_id})")
        runs.append({"from": s.name, "to": d.name, "wall_s": round(wall, 3), "job_ms": job_ms(stats, "Time elapsed"),
                     "downtime_ms": job_ms(stats, "Total downtime")})
        if not args.json:
            r = runs[-1]
            print(f"run {i + 1}: {src}->{dst} wall {r['wall_s']:.2f} s, job {r['job_ms']:.0f} ms, "
                  f"downtime {r['downtime_ms']:.0f} ms", flush=True)
        src = dst
    hosts[src].virsh("destroy", NAME)
    hosts[src].virsh("undefine", NAME)
    return runs


def run_hostd(args: argparse.Namespace, work: Path, undo: list, pair: LibvirtPair, loops: dict, smoke: Path,
              tls: bool) -> list[dict]:
    from api import hostd_pb2 as pb
    from tools.dev.hostd_pair import IMAGE, HostdSide, migrate, parse_ticks

    guest = {"kernel": smoke / "vmlinuz", "initrd": smoke / "initrd.img"}
    # Each host's carve puts VMs where the baseline pins them (A: CPU 0, B: CPU 1).
    sides = {h: HostdSide(work / f"hostd-{h}", host, Path(loops[h]), io_cpu=1 if h == "a" else 0,
                          smoke_guest=guest, pool_pages=args.memory_mib // 2 + 8, name=NAME,
                          migration_address=host.addr)
             for h, host in (("a", pair.a), ("b", pair.b))}
    for side in sides.values():
        undo.append(side.stop)
        side.start()
    tunes = {h: pb.IoTune(**TUNE[h][1]) for h in "ab"}
    vm = sides["a"].stub.CreateVM(pb.CreateVMRequest(
        request_id="bench-create", name=NAME, vcpus=1, memory_mib=args.memory_mib, hugepage_size_kb=2048,
        image=IMAGE, disks=[pb.DiskRequest(disk=Path(loops["a"]).name, iotune=tunes["a"])]), timeout=300)
    boot_id, last = sides["a"].wait_ticks(after=5, timeout=args.boot_timeout)[-1]
    runs = []
    src = "a"
    for i in range(args.runs):
        dst = "b" if src == "a" else "a"
        s, d = sides[src], sides[dst]
        with s.hold_console() as console:  # the source's hostd removes the file once the VM left
            moved, wall = migrate(s, d, vm.vm_id, iotune=tunes[dst], request_id=f"bench-{i}",
                                  bandwidth_mib_s=args.bandwidth, tls=tls, timeout_s=900)
            last_src = max(n for b, n in parse_ticks(console.read()) if b == boot_id)
        boot, last = d.wait_ticks(after=max(last, last_src), timeout=120)[-1]
        if boot != boot_id:
            raise RuntimeError(f"hostd run {i}: the guest rebooted on {d.host.name} (boot id {boot}, was {boot_id})")
        runs.append({"from": s.host.name, "to": d.host.name, "wall_s": round(wall, 3), "job_ms": moved.job_ms,
                     "downtime_ms": moved.downtime_ms})
        if not args.json:
            r = runs[-1]
            print(f"hostd run {i + 1}: {src}->{dst} wall {r['wall_s']:.2f} s, job {r['job_ms']:.0f} ms, "
                  f"downtime {r['downtime_ms']:.0f} ms", flush=True)
        src = dst
    sides[src].stub.DeleteVM(pb.DeleteVMRequest(vm_id=vm.vm_id), timeout=60)
    return runs


def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "p90": percentile(xs, 0.9), "n": len(xs)}


def ticks(h: Host) -> list[tuple[str, int]]:
    p = host_serial(h, NAME)
    text = p.read_text(errors="replace") if p.exists() else ""
    return [(m[1], int(m[2])) for m in TICK.finditer(text[:text.rfind("\n") + 1])]


def wait_tick(h: Host, *, after: int, timeout: float) -> tuple[str, int]:
    """(boot id, n) of the host's last tick once one numbered past ``after`` is printed."""
    deadline = time.monotonic() + timeout
    while True:
        t = ticks(h)
        if t and t[-1][1] > after:
            return t[-1]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{h.name}: the guest printed no tick past {after} within {timeout} s")
        time.sleep(0.3)


def report(result: dict) -> None:
    cap = f"{result['bandwidth_mib_s']} MiB/s" if result["bandwidth_mib_s"] else "uncapped"
    for path in ("baseline", "hostd"):
        if path not in result:
            continue
        r = result[path]
        print(f"\n{r['what']}: {result['memory_mib']} MiB guest, {result['disk_mib']} MiB raw disk, {cap}, "
              f"TLS {'on' if result['tls'] else 'off'}, {len(r['runs'])} runs")
        for key, unit, scale in (("wall_s", "s", 1), ("job_ms", "s", 1e-3), ("downtime_ms", "ms", 1)):
            s = r["summary"][key]
            print(f"  {key:12} median {s['median'] * scale:8.2f} {unit:2}  p90 {s['p90'] * scale:8.2f} {unit}")
    if "ratio" in result:
        print("\nhostd/baseline (medians): " + ", ".join(f"{k} {v:.2f}x" for k, v in result["ratio"].items()))


if __name__ == "__main__":
    sys.exit(main())
