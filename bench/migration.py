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

``--isolation`` (instead of the paths): the IO service on the source host during a move
(issue 38, item 7). A's carve puts the IO service on CPU 1 and VMs on CPU 0, and B's the
same (a host of the same model). The IO side of bench/isolation.py (its functions, imported)
pinned to A's IO CPU: cyclictest's wake-up latency and fio's 4 KiB O_DIRECT random reads
from a raw loop disk of its own (not the VM's), in one window per case:

  alone     the IO side, nothing else (``--seconds``);
  uncapped  while the guest moves A->B through hostd with no bandwidth cap;
  capped    the same with ``--cap`` MiB/s (the scheduler's ``[migration] bandwidth_mib_s``,
            sent with each MigrateVM).

A migration's window starts a second before MigrateVM (fio's start-up) and ends when the
move returns; between cases the guest goes back B->A outside any window, so each case moves
the same running guest. Printed: each case's median over ``--repeats`` with the ratio
against "alone" of the same run, the move's wall time, job time and downtime, the machine's
steal time and how busy the IO CPU was (softirq apart); then where the move's CPU time ran:
every thread of the source's and the target's QEMU, the source's hostd and libvirtd,
sampled every 20 ms (schedstat and the CPU each was last on), with the CPUs each may run on.
The bench and the daemons it starts stay off the IO CPU (as the carve keeps host daemons
off io_cpus); QEMU's threads go where hostd's domain XML pins them.

    .venv/bin/python -m bench.migration --isolation [--repeats 3] [--seconds 10] [--cap 32] [--short] [--json]

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
import threading
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
    iso = ap.add_argument_group("--isolation: the IO service on the source during a move")
    iso.add_argument("--isolation", action="store_true", help="measure the IO side alone, during an uncapped "
                     "and during a capped move (instead of --paths)")
    iso.add_argument("--cap", type=int, default=32, help="the capped case's bandwidth, MiB/s (default 32)")
    iso.add_argument("--seconds", type=float, default=10.0, help="the alone case's window (default 10)")
    iso.add_argument("--repeats", type=int, default=3, help="rounds of the three cases (default 3)")
    iso.add_argument("--iops", type=int, default=500, help="fio's request rate (default 500)")
    iso.add_argument("--short", action="store_true", help="3 s alone, 1 round: the mechanism, not the latencies")
    args = ap.parse_args(argv)
    if args.short:
        args.seconds, args.repeats = 3.0, 1
    if args.isolation and (args.cap <= 0 or args.repeats < 1 or args.seconds <= 0):
        ap.error("--isolation: --cap, --repeats and --seconds must be positive")
    if args.isolation and len(os.sched_getaffinity(0)) < 2:
        ap.error("--isolation needs 2 CPUs: one for the IO service, one for the VM")
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
    elif args.isolation:
        report_isolation(result)
    else:
        report(result)
    return 0


def run(args: argparse.Namespace, work: Path, undo: list) -> dict:
    smoke = work / "smoke"  # a copy: the shared cache may be rebuilt by another job while this runs
    shutil.copytree(smoke_image(), smoke)
    before = POOL.read_text().strip()
    pages = 2 * args.memory_mib // 2 + 8  # both ends hold the guest's memory during the copy

    def restore_pool() -> None:
        wait_hugepages_free()
        POOL.write_text(before)
    undo.append(restore_pool)
    POOL.write_text(str(int(before) + pages))
    if args.isolation:
        # what this bench starts (the pair's libvirtds, the hostds) stays off the IO CPU,
        # as hostd's carve keeps host daemons off io_cpus; cyclictest and fio pin themselves there
        os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - {ISO_IO_CPU})
    loops = {}
    for h in ("a", "b", "io") if args.isolation else "ab":
        img = work / f"disk-{h}.img"
        with open(img, "wb") as f:
            f.truncate(args.disk_mib * 2**20)
        loops[h] = subprocess.run(["losetup", "--find", "--show", str(img)], check=True, capture_output=True,
                                  text=True).stdout.strip()
        undo.append(lambda dev=loops[h]: subprocess.run(["losetup", "-d", dev], check=False))

    if "hostd" in args.paths or args.isolation:
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
    if args.isolation:
        result["bandwidth_mib_s"] = args.cap
        result["work"] = str(work)  # gone at the end (a test checks nothing it started is left)
        result["isolation"] = run_isolation(args, work, undo, pair, loops, smoke, tls)
        return result
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


# ---------------------------------------------------------------- --isolation

ISO_IO_CPU = 1  # A's (and B's) carve: the IO service on CPU 1, VMs on CPU 0
ISO_CASES = ("alone", "uncapped", "capped")
# QEMU's threads libvirt does not pin: the thread context ("TC <memory backend>") libvirt 9
# adds to preallocate a hugepage-backed guest's memory, with the node's CPUs as its affinity,
# and the threads it spawns. Where libvirt runs the VM in cgroups, the VM's cpuset confines
# them (this machine's system libvirtd: "TC tc-pc.ram" allowed on the VM CPU only); the
# pair's libvirtds have none (cgroup_controllers = [ ]), so here they may run on the IO CPU.
PREALLOC = ("TC ", "touch_pages")
QUIET = 0.05  # CPU-s per s of other processes' user threads on the IO CPU: a window "quiet" below it
LEAD_S = 1.0  # the IO side runs this long before a move starts (fio takes ~1 s to start its job)


class ThreadWatch:
    """Where processes' threads ran: every ``period_s``, each thread's CPU time
    (schedstat, ns) and the CPU it was last on (stat field 39); the time a thread used
    since the last sample is put on that CPU (exact for a pinned thread, a sampled view
    of one that moves). ``pids()`` gives {role: [pid, ...]} at each sample (a target's
    QEMU appears during the move, the source's goes at its end)."""

    def __init__(self, pids, period_s: float = 0.02):
        import threading
        self.pids, self.period = pids, period_s
        self.last: dict[int, int] = {}
        self.used: dict[tuple[str, str], dict[int, int]] = {}  # (role, comm) -> {cpu: ns}
        self.allowed: dict[tuple[str, str], set[str]] = {}
        self._baseline = False
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "ThreadWatch":
        self._baseline = True
        self._sample()  # the baseline: only what threads use from here on counts
        self._baseline = False
        self.used.clear()
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def _sample(self) -> None:
        for role, pids in self.pids().items():
            for pid in pids:
                try:
                    tids = os.listdir(f"/proc/{pid}/task")
                except OSError:
                    continue
                for tid in tids:
                    t = f"/proc/{pid}/task/{tid}"
                    try:
                        stat = Path(f"{t}/stat").read_text()
                        ns = int(Path(f"{t}/schedstat").read_text().split()[0])
                        comm = stat[stat.index("(") + 1:stat.rindex(")")]
                        cpu = int(stat[stat.rindex(")") + 2:].split()[36])  # field 39, "processor"
                        key = (role, comm)
                        if int(tid) not in self.last or key not in self.allowed:
                            self.allowed.setdefault(key, set()).add(next(
                                line.split(":", 1)[1].strip() for line in Path(f"{t}/status").read_text().splitlines()
                                if line.startswith("Cpus_allowed_list:")))
                    except (OSError, ValueError, IndexError, StopIteration):
                        continue
                    # a thread first seen after the baseline was born in the window: all of its time
                    delta = ns - self.last.get(int(tid), ns if self._baseline else 0)
                    self.last[int(tid)] = ns
                    if delta > 0:
                        per = self.used.setdefault(key, {})
                        per[cpu] = per.get(cpu, 0) + delta

    def summary(self, io_cpu: int) -> dict[str, dict]:
        """{"role/comm": {"cpu_ms", "on_io_cpu_ms", "allowed"}} for threads that ran."""
        out = {}
        for (role, comm), per in sorted(self.used.items()):
            out[f"{role}/{comm}"] = {"cpu_ms": round(sum(per.values()) / 1e6, 1),
                                     "on_io_cpu_ms": round(per.get(io_cpu, 0) / 1e6, 1),
                                     "allowed": ",".join(sorted(self.allowed.get((role, comm), set())))}
        return out


class GateView:
    """What hostd's IO-health signal (hostd/health: readers + ``signal.diff``, the numbers
    the rollout gate judges) says of the window: one sample every ``period_s``, the IO
    side's threads as the IO service, both QEMUs' threads as VMs (where hostd reads them
    from the VMs' cgroup: the pair's libvirtds place no cgroups, so they are given here)."""

    def __init__(self, io_cpu: int, io_pids, vm_pids, period_s: float = 0.5):
        import threading
        self.io_cpu, self.io_pids, self.vm_pids, self.period = io_cpu, io_pids, vm_pids, period_s
        self.stats: list = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _tids(self, pids: list[int]) -> frozenset[int]:
        out: set[int] = set()
        for pid in pids:
            try:
                out.update(int(t) for t in os.listdir(f"/proc/{pid}/task"))
            except OSError:
                pass
        return frozenset(out)

    def _sample(self):
        from hostd.discover.fs import HostFs
        from hostd.health import readers
        from hostd.health.signal import Sample
        fs = HostFs(Path("/"))
        return Sample(mono=time.monotonic(), wall=time.time(), cpu=readers.read_cpu_times(fs),
                      irqs=readers.read_interrupts(fs), threads=readers.read_threads(fs),
                      io_tids=self._tids(self.io_pids()), vm_tids=self._tids(self.vm_pids()),
                      psi=readers.read_psi(fs, "proc/pressure/cpu"))

    def _run(self) -> None:
        from hostd.health.signal import diff
        prev = self._sample()
        while not self._stop.wait(self.period):
            cur = self._sample()
            self.stats.append(diff(prev, cur, (self.io_cpu,)))
            prev = cur

    def __enter__(self) -> "GateView":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def summary(self) -> dict:
        """Over the window: foreign CPU on the IO CPU (user threads: what the gate's ceiling
        judges; kernel threads apart), the VMs' and the rest's CPU, the top foreign threads."""
        st = self.stats
        span = sum(x.interval_s for x in st) or 1.0
        top: dict[str, float] = {}
        for x in st:
            for f in x.top_foreign:
                k = f"{f.comm}{' (kernel)' if f.kthread else ''}"
                top[k] = top.get(k, 0.0) + f.cpu_s
        psi = [x.psi_some_stall for x in st if x.psi_some_stall is not None]
        return {"gate_samples": len(st),
                "gate_foreign_user_cpu": sum(x.foreign_cpu_s - x.foreign_kernel_cpu_s for x in st) / span,
                "gate_foreign_kernel_cpu": sum(x.foreign_kernel_cpu_s for x in st) / span,
                "gate_cpu_vms": sum(x.cpu_vms * x.interval_s for x in st) / span,
                "gate_cpu_other": sum(x.cpu_other * x.interval_s for x in st) / span,
                "gate_psi_stall": statistics.mean(psi) if psi else None,
                "gate_top_foreign": {k: round(v, 3) for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:6]}}


def cpu_line(cpu: int) -> list[int]:
    """/proc/stat's jiffies of one CPU: user nice system idle iowait irq softirq steal."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            return [int(x) for x in line.split()[1:9]]
    raise RuntimeError(f"cpu{cpu} not in /proc/stat")


def fio_workers(pid: int) -> list[int]:
    """fio's job processes (its children)."""
    try:
        return [int(c) for t in os.listdir(f"/proc/{pid}/task")
                for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    except OSError:
        return []


def io_window(io_cpu: int, target: str, iops: int, body, vm_pids) -> dict:
    """bench/isolation.py's IO side (cyclictest + fio on ``io_cpu``) for the time ``body()``
    takes after a lead of LEAD_S, then stopped (SIGINT: both print their results). Returns
    their percentiles, the window, the machine's steal (in CPUs) and the IO CPU's busy and
    softirq fractions, hostd's IO-health signal over the window (GateView; ``vm_pids()``:
    the QEMUs), plus what ``body`` returned."""
    import signal as sig

    from bench.isolation import cyclictest, cyclictest_result, fio, fio_result, steal_ticks
    hz = os.sysconf("SC_CLK_TCK")
    steal0, c0, t0 = steal_ticks(), cpu_line(io_cpu), time.monotonic()
    ct, fi = cyclictest(io_cpu, 3600), fio(io_cpu, target, 3600, iops)
    try:
        with GateView(io_cpu, lambda: [ct.pid, fi.pid, *fio_workers(fi.pid)], vm_pids) as gate:
            time.sleep(LEAD_S)
            extra = body()
    finally:
        for p in (ct, fi):
            if p.poll() is None:
                p.send_signal(sig.SIGINT)
    out = cyclictest_result(ct) | fio_result(fi) | gate.summary()
    window = time.monotonic() - t0
    c1 = cpu_line(io_cpu)
    d = [b - a for a, b in zip(c0, c1)]
    total = max(1, sum(d))
    out |= {"window_s": round(window, 2), "steal_cpus": (steal_ticks() - steal0) / hz / window,
            "io_cpu_busy": (total - d[3] - d[4]) / total, "io_cpu_softirq": d[6] / total}
    return out | extra


def run_isolation(args: argparse.Namespace, work: Path, undo: list, pair: LibvirtPair, loops: dict, smoke: Path,
                  tls: bool) -> dict:
    from api import hostd_pb2 as pb
    from tools.dev.hostd_pair import IMAGE, HostdSide, migrate, parse_ticks

    guest = {"kernel": smoke / "vmlinuz", "initrd": smoke / "initrd.img"}
    sides = {h: HostdSide(work / f"hostd-{h}", host, Path(loops[h]), io_cpu=ISO_IO_CPU, smoke_guest=guest,
                          pool_pages=args.memory_mib // 2 + 8, name=NAME, migration_address=host.addr)
             for h, host in (("a", pair.a), ("b", pair.b))}
    for side in sides.values():
        undo.append(side.stop)
        side.start()
    tune = pb.IoTune(**TUNE["a"][1])
    vm = sides["a"].stub.CreateVM(pb.CreateVMRequest(
        request_id="bench-iso-create", name=NAME, vcpus=1, memory_mib=args.memory_mib, hugepage_size_kb=2048,
        image=IMAGE, disks=[pb.DiskRequest(disk=Path(loops["a"]).name, iotune=tune)]), timeout=300)
    holder = {"side": "a"}  # which side holds the VM (for the cleanup below)

    def delete() -> None:
        side = sides[holder["side"]]
        try:
            side.stub.DeleteVM(pb.DeleteVMRequest(vm_id=vm.vm_id), timeout=60)
        except Exception as e:  # noqa: BLE001 - the pair's teardown destroys what is left
            print(f"cleanup: DeleteVM on {side.host.name}: {e}", file=sys.stderr)
    undo.append(delete)
    boot_id, last = sides["a"].wait_ticks(after=5, timeout=args.boot_timeout)[-1]
    tick = {"last": last, "moves": 0}

    def move(src: str, dst: str, bandwidth: int) -> dict:
        s, d = sides[src], sides[dst]
        speeds: list[int] = []  # the source domain's migration speed as libvirt holds it, MiB/s
        done = threading.Event()

        def speed() -> None:
            while not done.wait(0.5):
                r = s.host.virsh("migrate-getspeed", NAME, check=False, timeout=30)
                if r.returncode == 0 and r.stdout.strip().isdigit():
                    speeds.append(int(r.stdout))
        probe = threading.Thread(target=speed, daemon=True)
        probe.start()
        try:
            with s.hold_console() as console:
                moved, wall = migrate(s, d, vm.vm_id, iotune=tune, request_id=f"bench-iso-{tick['moves']}",
                                      bandwidth_mib_s=bandwidth, tls=tls, timeout_s=900)
                holder["side"] = dst
                tick["moves"] += 1
                last_src = max((n for b, n in parse_ticks(console.read()) if b == boot_id), default=tick["last"])
        finally:
            done.set()
            probe.join(35)
        return {"wall_s": round(wall, 3), "job_ms": moved.job_ms, "downtime_ms": moved.downtime_ms,
                "data_mib_s": round(moved.data_bytes / 2**20 / max(moved.job_ms / 1000, 1e-3), 1),
                "libvirt_speed_mib_s": min(speeds) if speeds else None, "_last_src": last_src}

    def guest_went_on(dst: str, after: int) -> None:
        boot, tick["last"] = sides[dst].wait_ticks(after=after, timeout=120)[-1]
        if boot != boot_id:
            raise RuntimeError(f"isolation: the guest rebooted on {dst} (boot id {boot}, was {boot_id})")

    def roles() -> dict[str, list[int]]:
        return {"source qemu": pair.a.qemu_pids(), "target qemu": pair.b.qemu_pids(),
                "source hostd": [sides["a"].hostd.proc.pid], "source libvirtd": [pair.a.pid]}

    def qemus() -> list[int]:
        return pair.a.qemu_pids() + pair.b.qemu_pids()

    vm_cpus = list(sides["a"].stub.GetVM(pb.GetVMRequest(vm_id=vm.vm_id), timeout=10).vcpu_pins)
    cases: dict[str, list[dict]] = {c: [] for c in ISO_CASES}
    threads: dict[str, list[dict]] = {c: [] for c in ISO_CASES[1:]}
    io_dev = loops["io"]
    with open(io_dev, "rb") as f:  # sparse reads: the request path, not the medium
        f.read(1 << 20)
    for rep in range(args.repeats):
        for case in ISO_CASES:
            print(f"[{rep + 1}/{args.repeats}] {case} ...", file=sys.stderr, flush=True)
            if case == "alone":
                cases[case].append(io_window(ISO_IO_CPU, io_dev, args.iops, lambda: time.sleep(args.seconds) or {},
                                             qemus))
                continue
            bw = args.cap if case == "capped" else 0
            with ThreadWatch(roles) as watch:
                r = io_window(ISO_IO_CPU, io_dev, args.iops, lambda bw=bw: move("a", "b", bw), qemus)
            threads[case].append(watch.summary(ISO_IO_CPU))
            guest_went_on("b", r.pop("_last_src"))
            cases[case].append(r)
            back = move("b", "a", 0)  # outside any window: the next case moves the same guest
            guest_went_on("a", back["_last_src"])
    on = {h: {"domains": sides[h].domains(), "hostd_vms": [n for n, _ in sides[h].vms()],
              "qemu": len(sides[h].host.qemu_pids())} for h in "ab"}
    return {"io_cpu": ISO_IO_CPU, "vm_cpus": vm_cpus, "cap_mib_s": args.cap, "seconds": args.seconds,
            "repeats": args.repeats, "iops": args.iops, "moves": tick["moves"], "cases": cases,
            "threads": threads, "end": on, "boot_id": boot_id}


ISO_COLS = (("wake p99 us", "wake_p99_us"), ("wake p99.9 us", "wake_p999_us"), ("io p50 us", "io_p50_us"),
            ("io p99 us", "io_p99_us"), ("io p99.9 us", "io_p999_us"))


def report_isolation(result: dict) -> None:
    iso = result["isolation"]
    cases = iso["cases"]

    def med(case: str, key: str) -> float | None:
        vals = [r[key] for r in cases[case] if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    print(f"\nthe IO service on the source during a move: io_cpu {iso['io_cpu']}, VM on CPU "
          f"{','.join(map(str, iso['vm_cpus']))}, {result['memory_mib']} MiB guest, {result['disk_mib']} MiB raw "
          f"disk, TLS {'on' if result['tls'] else 'off'}, fio {iso['iops']} IOPS, {iso['repeats']} rounds "
          f"(medians; ratios against alone)")
    cols = [*ISO_COLS, ("window s", "window_s"), ("move wall s", "wall_s"), ("job ms", "job_ms"),
            ("downtime ms", "downtime_ms"), ("IO CPU busy", "io_cpu_busy"), ("softirq", "io_cpu_softirq"),
            ("steal CPUs", "steal_cpus")]
    print(f"{'case':18}" + "".join(f"{h:>14}" for h, _ in cols))
    for case in ISO_CASES:
        label = f"capped {iso['cap_mib_s']} MiB/s" if case == "capped" else case
        cells = []
        for _, k in cols:
            v = med(case, k)
            cells.append("-" if v is None else f"{v:.3f}" if k in ("io_cpu_busy", "io_cpu_softirq", "steal_cpus")
                         else f"{v:.1f}" if k in ("window_s", "wall_s") else f"{v:.0f}")
        print(f"{label:18}" + "".join(f"{c:>14}" for c in cells))
    for case in ISO_CASES[1:]:
        ratios = []
        for h, k in ISO_COLS:
            a, b = med("alone", k), med(case, k)
            if a and b is not None:
                ratios.append(f"{h} {b / a:.2f}x")
        print(f"{case}/alone: " + ", ".join(ratios))
        per = []  # each round's case against the alone of its round: the machine's load drifts between rounds
        for h, k in ISO_COLS:
            rs = [b[k] / a[k] for a, b in zip(cases["alone"], cases[case]) if a.get(k) and b.get(k) is not None]
            if rs:
                per.append(f"{h} {statistics.median(rs):.2f}x [{min(rs):.2f}-{max(rs):.2f}]")
        print(f"{case}/alone, round by round (median [range]): " + ", ".join(per))
    # Rounds where nothing else ran on the IO CPU in any of the three windows (hostd's signal:
    # foreign user CPU there below QUIET), as under the exclusive carve: the move's own effect.
    quiet = [i for i in range(min(len(cases[c]) for c in ISO_CASES))
             if all(cases[c][i].get("gate_foreign_user_cpu", 1.0) < QUIET for c in ISO_CASES)]
    print(f"\nrounds with no other user work on the IO CPU (foreign user CPU < {QUIET} in all three "
          f"windows): {len(quiet)} of {iso['repeats']}")
    for i in quiet:
        print(f"  round {i + 1}: " + "; ".join(
            f"{c} " + ", ".join(f"{h} {cases[c][i][k]:.0f}" for h, k in ISO_COLS) for c in ISO_CASES))
        for c in ISO_CASES[1:]:
            print(f"    {c}/alone: " + ", ".join(f"{h} {cases[c][i][k] / cases['alone'][i][k]:.2f}x"
                                               for h, k in ISO_COLS if cases["alone"][i][k]))
    print("\nhostd's IO-health signal over each window (the rollout gate's input; CPUs = CPU-s per s):")
    for case in ISO_CASES:
        top: dict[str, float] = {}
        for r in cases[case]:
            for k, v in r.get("gate_top_foreign", {}).items():
                top[k] = top.get(k, 0.0) + v
        psi = med(case, "gate_psi_stall")
        print(f"  {case:9} foreign on the IO CPU: user {med(case, 'gate_foreign_user_cpu') or 0:.3f}, kernel "
              f"{med(case, 'gate_foreign_kernel_cpu') or 0:.3f}; VMs {med(case, 'gate_cpu_vms') or 0:.3f}, other "
              f"{med(case, 'gate_cpu_other') or 0:.3f}; PSI some {'-' if psi is None else f'{psi:.3f}'}; top foreign: "
              + (", ".join(f"{k} {v:.2f} s" for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:4]) or "none"))
    for case in ISO_CASES[1:]:
        print(f"\nwhere the {case} move's CPU time ran (summed over {iso['repeats']} rounds; io_cpu {iso['io_cpu']}):")
        total: dict[str, dict] = {}
        for run in iso["threads"][case]:
            for k, v in run.items():
                t = total.setdefault(k, {"cpu_ms": 0.0, "on_io_cpu_ms": 0.0, "allowed": v["allowed"]})
                t["cpu_ms"] += v["cpu_ms"]
                t["on_io_cpu_ms"] += v["on_io_cpu_ms"]
        for k, v in sorted(total.items(), key=lambda kv: -kv[1]["cpu_ms"]):
            if v["cpu_ms"] >= 1 or k.split("/", 1)[1].startswith(PREALLOC):
                print(f"  {k:40} {v['cpu_ms']:9.0f} ms  on the IO CPU {v['on_io_cpu_ms']:7.0f} ms  "
                      f"may run on {v['allowed']}"
                      + ("  (libvirt's prealloc thread context: no cgroups in the pair)"
                         if k.split("/", 1)[1].startswith(PREALLOC) else ""))
    print("\nat the end: " + "; ".join(f"{h}: domains {v['domains']}, hostd {v['hostd_vms']}, {v['qemu']} QEMU"
                                      for h, v in iso["end"].items()))


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
