"""What `diagnose` knows about a time window: counts per vCPU thread, from any source.

Built from parsed trace events (`from_events`, for recordings and ftrace text) or from the
bpftrace maps of a live run (`from_bpf_maps`). Pure: no IO here.

An exit is a *memory fault* when it is an EPT violation (VMX) or nested page fault (SVM)
during which no MMIO access was traced: those are the faults hugepage backing removes.
EPT_MISCONFIG is not counted as one (KVM marks MMIO sptes misconfigured: it is MMIO).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tools.kvm_utils.aggregate import ThreadInfo
from tools.kvm_utils.arch import ISA_TO_VENDOR, PMU_MSRS, exit_reason_name, userspace_exit_name
from tools.kvm_utils.events import Entry, Event, Exit, Mmio, Msr, Pio, UserspaceExit, Wakeup

X2APIC_ICR = 0x830
#: exit reason names (VMX, SVM) grouped by what the rules ask about
HLT_REASONS = frozenset({"HLT", "hlt"})
EXTINT_REASONS = frozenset({"EXTERNAL_INTERRUPT", "interrupt"})
FAULT_REASONS = frozenset({"EPT_VIOLATION", "npf"})
RDPMC_REASONS = frozenset({"RDPMC", "rdpmc"})
#: VM of threads whose process is unknown (plain ftrace text carries no VM names)
UNKNOWN_VM = "(unknown VM)"
#: two PMU accesses further apart than this belong to different bursts (sampling rounds)
BURST_GAP_NS = 100_000_000


@dataclass
class Evidence:
    duration_s: float
    source: str
    threads: dict[int, ThreadInfo] = field(default_factory=dict)
    exits: Counter = field(default_factory=Counter)        # (tid, reason name) -> n
    msr: Counter = field(default_factory=Counter)          # (tid, ecx, write) -> n
    icr_vectors: Counter = field(default_factory=Counter)  # (tid, vector) -> x2APIC ICR writes
    pio: Counter = field(default_factory=Counter)          # (tid, port, write) -> n
    mmio: Counter = field(default_factory=Counter)         # (tid, gpa, write) -> n
    mem_faults: Counter = field(default_factory=Counter)   # tid -> EPT/NPF exits without MMIO
    user_exits: Counter = field(default_factory=Counter)   # (tid, reason) -> n
    wakeups: Counter = field(default_factory=Counter)      # tid -> kvm_vcpu_wakeup
    pmu_times: dict[int, list[int]] = field(default_factory=dict)  # tid -> ts_ns of PMU accesses
    saw_exits: bool = False   # kvm_exit fired at all (it never does on a PVM host)
    lost_events: int = 0      # events the trace buffer dropped (ftrace overruns): counts are lower bounds

    # ------------------------------------------------------------------ views
    def vm_of(self, tid: int) -> str:
        info = self.threads.get(tid)
        return info.vm if info and info.vm else UNKNOWN_VM

    def vcpu_of(self, tid: int) -> int | None:
        info = self.threads.get(tid)
        return info.vcpu if info else None

    def tids(self) -> set[int]:
        out: set[int] = set(self.mem_faults) | set(self.wakeups) | set(self.pmu_times)
        for c in (self.exits, self.msr, self.icr_vectors, self.pio, self.mmio, self.user_exits):
            out.update(k[0] for k in c)
        return out

    def vms(self) -> list[str]:
        return sorted({self.vm_of(t) for t in self.tids()})

    def rate(self, n: int) -> float:
        return n / self.duration_s if self.duration_s > 0 else 0.0

    def only_vm(self, vm: str) -> Evidence:
        """The same evidence restricted to one VM's threads."""
        keep = {t for t in self.tids() if self.vm_of(t) == vm}
        sel = lambda c: Counter({k: n for k, n in c.items() if (k[0] if isinstance(k, tuple) else k) in keep})  # noqa: E731
        return Evidence(self.duration_s, self.source, {t: i for t, i in self.threads.items() if t in keep},
                        sel(self.exits), sel(self.msr), sel(self.icr_vectors), sel(self.pio), sel(self.mmio),
                        sel(self.mem_faults), sel(self.user_exits), sel(self.wakeups),
                        {t: v for t, v in self.pmu_times.items() if t in keep}, self.saw_exits, self.lost_events)

    def total_exits(self) -> int:
        return sum(self.exits.values())


def pmu_period_s(times_ns: Iterable[int]) -> tuple[int, float | None]:
    """(number of bursts, median seconds between burst starts) of PMU accesses; None if < 2."""
    starts: list[int] = []
    last = None
    for t in sorted(times_ns):
        if last is None or t - last > BURST_GAP_NS:
            starts.append(t)
        last = t
    if len(starts) < 2:
        return len(starts), None
    gaps = sorted(b - a for a, b in zip(starts, starts[1:]))
    return len(starts), round(gaps[len(gaps) // 2] / 1e9, 3)


class _Builder:
    """Feeds events in trace order; an EPT/NPF exit is decided at its entry or the next exit."""

    def __init__(self, ev: Evidence) -> None:
        self.ev = ev
        self.open_fault: dict[int, bool] = {}   # tid -> MMIO seen during the open EPT/NPF exit

    def _close(self, tid: int) -> None:
        mmio_seen = self.open_fault.pop(tid, None)
        if mmio_seen is False:
            self.ev.mem_faults[tid] += 1

    def feed(self, e: Event) -> None:
        ev = self.ev
        if isinstance(e, Exit):
            ev.saw_exits = True
            self._close(e.tid)
            ev.exits[(e.tid, e.reason)] += 1
            if e.reason in FAULT_REASONS:
                self.open_fault[e.tid] = False
        elif isinstance(e, Entry):
            self._close(e.tid)
        elif isinstance(e, Msr):
            ev.msr[(e.tid, e.ecx, e.write)] += 1
            if e.ecx == X2APIC_ICR and e.write:
                ev.icr_vectors[(e.tid, e.data & 0xff)] += 1
            if e.ecx in PMU_MSRS:
                ev.pmu_times.setdefault(e.tid, []).append(e.ts_ns)
        elif isinstance(e, Pio):
            ev.pio[(e.tid, e.port, e.write)] += 1
        elif isinstance(e, Mmio):
            if e.tid in self.open_fault:
                self.open_fault[e.tid] = True
            if not e.unsatisfied:        # its completing "read" event is the one counted
                ev.mmio[(e.tid, e.gpa, e.write)] += 1
        elif isinstance(e, UserspaceExit):
            ev.user_exits[(e.tid, e.reason)] += 1
        elif isinstance(e, Wakeup):
            ev.wakeups[e.tid] += 1

    def finish(self) -> Evidence:
        for tid in list(self.open_fault):
            self._close(tid)
        return self.ev


def from_events(events: Iterable[Event], duration_s: float, threads: Mapping[int, ThreadInfo],
                source: str = "trace") -> Evidence:
    b = _Builder(Evidence(duration_s, source, dict(threads)))
    for e in events:
        if isinstance(e, Exit) and e.reason in RDPMC_REASONS:
            b.ev.pmu_times.setdefault(e.tid, []).append(e.ts_ns)
        b.feed(e)
    return b.finish()


def from_bpf_maps(maps: Mapping[str, Mapping[tuple[int, ...], int]], duration_s: float,
                  threads: Mapping[int, ThreadInfo]) -> Evidence:
    """Maps of `diagnose.live.SCRIPT` (keys start with pid, tid) -> Evidence.

    Threads not in `threads` (gone by the end) are named after their process, `pid<PID>`.
    """
    ev = Evidence(duration_s, "bpftrace", dict(threads))
    g = lambda name: maps.get(name, {})  # noqa: E731

    def seen(pid: int, tid: int) -> None:
        ev.threads.setdefault(tid, ThreadInfo(None, f"pid{pid}"))
    for (pid, tid, isa, code), n in g("x").items():
        seen(pid, tid)
        ev.saw_exits = True
        ev.exits[(tid, exit_reason_name(ISA_TO_VENDOR.get(isa), code))] += n
    for (pid, tid, ecx, write), n in g("m").items():
        seen(pid, tid)
        ev.msr[(tid, ecx, bool(write))] += n
    for (pid, tid, vec), n in g("icr").items():
        ev.icr_vectors[(tid, vec)] += n
    for (pid, tid, port, write), n in g("p").items():
        seen(pid, tid)
        ev.pio[(tid, port, bool(write))] += n
    for (pid, tid, gpa, write), n in g("mm").items():
        seen(pid, tid)
        ev.mmio[(tid, gpa, bool(write))] += n
    for (pid, tid, reason), n in g("u").items():
        seen(pid, tid)
        ev.user_exits[(tid, userspace_exit_name(reason))] += n
    for (pid, tid), n in g("w").items():
        seen(pid, tid)
        ev.wakeups[tid] += n
    for (pid, tid), n in g("f").items():
        ev.mem_faults[tid] += n
    return ev
