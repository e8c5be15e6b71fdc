"""`kvm-utils export`: exit and event counts per VM as Prometheus metrics, for as long as
it runs (a systemd unit beside hostd's: tools/kvm_utils/systemd/kvm-utils-export.service).

It counts with the same engines as `exits` (perf's per-thread tracepoint counters, or the
one bpftrace counting program on VMX/SVM hosts), takes what changed every `--interval`
and adds it to counters labelled by VM (QEMU's `-name guest=NAME`; `(all)` when it counts
per CPU because no VM runs). Prometheus computes the rates. What it serves:

    kvmu_exits_total{vm, reason}            kvm_exit by exit reason (VMX/SVM; `kvm_exit(all)` elsewhere)
    kvmu_userspace_exits_total{vm, reason}  exits to QEMU, by KVM_EXIT_* reason (perf engine: `ALL`)
    kvmu_events_total{vm, event}            kvm_pio, kvm_mmio, kvm_msr, kvm_cpuid, kvm_hypercall, ...
    kvmu_msr_writes_total{vm, msr}          writes to the MSRs the storms show in (TSC_DEADLINE, x2APIC
                                            ICR, EOI, TMICT, LVTT), one filtered counter each (perf engine)
    kvmu_halt_wakeups_total{vm}             kvm_vcpu_wakeup: a halted vCPU woken (polled or scheduled)
    kvmu_vcpu_threads{vm}                   vCPU threads counted now
    kvmu_export_info{engine, vendor}        1

Posted-interrupt wake-ups (the source's fleet histogram: 20K-100K/s a host without
`nohlt_list`) have no tracepoint: they need the kprobe engine (`pi_wakeup_handler`),
which this exporter does not run. A VM's threads are picked up within an interval of
their start; the counters of a thread that exited are closed after their last read, so a
long run does not collect file descriptors as VMs come and go.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, disable_created_metrics, start_http_server
from prometheus_client import Counter as PromCounter

from tools.kvm_utils.arch import Vendor
from tools.kvm_utils.errors import KvmUtilsError
from tools.kvm_utils.live import Counters, Spec, Target, choose_engine, pick_up_new_threads
from tools.kvm_utils.record import host_vendor
from tools.kvm_utils.sources.tracefs import tracefs_mounted, tracepoint_id
from tools.kvm_utils.stopping import deferred

log = logging.getLogger(__name__)

# the MSRs whose writes the diagnosis rules look at: a TSC-deadline storm (0x6e0 and the
# timer's LVT/initial count), IPIs (the x2APIC ICR) and their EOIs
DEFAULT_MSRS = {0x6E0: "IA32_TSC_DEADLINE", 0x830: "X2APIC_ICR", 0x80B: "X2APIC_EOI", 0x838: "X2APIC_TMICT",
                0x832: "X2APIC_LVTT"}
EXPORT_EVENTS = ("kvm_pio", "kvm_mmio", "kvm_fast_mmio", "kvm_msr", "kvm_cpuid", "kvm_hypercall", "kvm_vcpu_wakeup")


def msr_label(msr: int) -> str:
    return DEFAULT_MSRS.get(msr, f"{msr:#x}")


def parse_listen(s: str) -> tuple[str, int]:
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise KvmUtilsError(f"--listen {s!r}: expected HOST:PORT (127.0.0.1:9745)")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_msrs(values: Iterable[str] | None) -> list[int]:
    if not values:
        return sorted(DEFAULT_MSRS)
    out = []
    for v in values:
        for part in v.split(","):
            try:
                out.append(int(part, 0))
            except ValueError:
                raise KvmUtilsError(f"--msr {part!r}: expected a number (0x6e0)") from None
    return sorted(set(out))


def msr_specs(tracefs: Path, msrs: list[int]) -> list[Spec]:
    """One counter a MSR on kvm_msr, filtered to writes of it: the filter runs on kvm_msr
    hits only (MSR exits), not on every exit."""
    tp = tracepoint_id(tracefs, "kvm", "kvm_msr")
    return [Spec("msr", msr_label(m), tp, f"ecx=={m} && write==1") for m in msrs]


class Metrics:
    """The registry and what one interval's deltas add to it (pure: unit-tested)."""

    def __init__(self, engine: str, vendor: Vendor | None):
        self.registry = CollectorRegistry()
        r = self.registry
        self.exits = PromCounter("kvmu_exits", "kvm_exit by exit reason", ["vm", "reason"], registry=r)
        self.user = PromCounter("kvmu_userspace_exits", "exits to userspace (QEMU) by reason", ["vm", "reason"],
                                registry=r)
        self.events = PromCounter("kvmu_events", "kvm tracepoint hits", ["vm", "event"], registry=r)
        self.msr = PromCounter("kvmu_msr_writes", "guest writes of a watched MSR", ["vm", "msr"], registry=r)
        self.wakeups = PromCounter("kvmu_halt_wakeups", "halted vCPUs woken (kvm_vcpu_wakeup)", ["vm"], registry=r)
        self.threads = Gauge("kvmu_vcpu_threads", "vCPU threads counted", ["vm"], registry=r)
        info = Gauge("kvmu_export_info", "the engine counting", ["engine", "vendor"], registry=r)
        info.labels(engine, vendor.value if vendor else "unknown").set(1)
        self.cpu = Gauge("kvmu_export_cpu_seconds", "CPU time of this exporter (user + system)", registry=r)

    def add(self, delta: Counter) -> None:
        for (t, s), n in delta.items():
            if n <= 0:
                continue
            vm = t.vm or "(unnamed)"
            if s.kind == "exit":
                self.exits.labels(vm, s.label).inc(n)
            elif s.kind == "user":
                self.user.labels(vm, s.label).inc(n)
            elif s.kind == "msr":
                self.msr.labels(vm, s.label).inc(n)
            elif s.label == "kvm_vcpu_wakeup":
                self.wakeups.labels(vm).inc(n)
                self.events.labels(vm, s.label).inc(n)
            else:
                self.events.labels(vm, s.label).inc(n)

    def set_threads(self, targets: list[Target]) -> None:
        per_vm = Counter(t.vm or "(unnamed)" for t in targets if t.tid >= 0)
        self.threads.clear()
        for vm, n in per_vm.items():
            self.threads.labels(vm).set(n)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu.set(ru.ru_utime + ru.ru_stime)


def drop_gone(counters: Counters, proc: Path = Path("/proc")) -> int:
    """Close the counters of vCPU threads that exited (after the delta that read them)."""
    gone = [t for t in counters.targets if t.tid >= 0 and not (proc / str(t.tid)).exists()]
    for t in gone:
        for key in [k for k in counters.fds if k[0] == t]:
            os.close(counters.fds.pop(key))
            counters.last.pop(key, None)
        counters.targets.remove(t)
    return len(gone)


def run_export(args: argparse.Namespace) -> int:
    import shutil

    from tools.kvm_utils.live import BpfCounters, counter_specs
    from tools.kvm_utils.sources import perf
    vendor = Vendor(v) if (v := host_vendor()) else None
    engine = choose_engine(args.engine, vendor, shutil.which("bpftrace") is not None)
    host, port = parse_listen(args.listen)
    msrs = parse_msrs(args.msr)
    if engine == "bpf":
        counters = BpfCounters(args.tracefs, set(), events=EXPORT_EVENTS)
    else:
        perf.raise_fd_limit()
        with tracefs_mounted(args.tracefs) as root:
            specs = counter_specs(root, vendor, events=EXPORT_EVENTS) + msr_specs(root, msrs)
        counters = Counters(specs)
    disable_created_metrics()  # no *_created series beside each counter: half the scrape, no use here
    m = Metrics(engine, vendor)
    args.pid, args.guest = None, None  # every VM on the host
    seen: set[int] = set()
    system = False  # per vCPU thread always: VMs start after the exporter; none may run yet
    try:
        pick_up_new_threads(counters, args, engine, system, seen)
        server, thread = start_http_server(port, host, registry=m.registry)
        print(f"kvm-utils export: serving http://{host}:{port}/metrics ({engine} engine, per vCPU thread); "
              "Ctrl-C or SIGTERM ends", file=sys.stderr, flush=True)
        try:
            while True:
                time.sleep(args.interval)
                with deferred():
                    m.add(counters.delta())
                if engine != "bpf":
                    drop_gone(counters)
                    pick_up_new_threads(counters, args, engine, system, seen)
                    seen &= {t.tid for t in counters.targets}  # a tid reused by a new VM is counted again
                m.set_threads(counters.targets)
        except KeyboardInterrupt:
            pass
        server.shutdown()
    finally:
        counters.close()
    return 0
