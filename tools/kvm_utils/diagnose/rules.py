"""Known pathologies of VMs on hybrid hosts -> findings with evidence and the fix. Pure.

Every rule looks at one VM's `Evidence` and names the exact ports/MSRs/vCPUs, counts and
rates it saw, and the guestimages profile setting (guestimages/profiles/*.toml) or host
setting that removes the exits. Thresholds are per VM (per vCPU for HLT) and overridable.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from tools.kvm_utils.arch import PMU_MSRS, msr_name
from tools.kvm_utils.diagnose.evidence import (EXTINT_REASONS, HLT_REASONS, RDPMC_REASONS, X2APIC_ICR,
                                               Evidence, pmu_period_s)

#: ACPI PM timer ports: q35/ICH9 (PMBASE 0x600 + 8) and i440fx/PIIX4 (0xb000 + 8)
PM_TIMER_PORTS = {0x608: "ACPI PM timer (q35)", 0xb008: "ACPI PM timer (i440fx/PIIX4)"}
HPET_COUNTER_GPA = 0xfed000f0
TSC_DEADLINE = 0x6e0
#: Linux x86 IPI vectors (arch/x86/include/asm/irq_vectors.h)
IPI_VECTORS = {0xfd: "RESCHEDULE", 0xfc: "CALL_FUNCTION", 0xfb: "CALL_FUNCTION_SINGLE",
               0xf6: "IRQ_WORK", 0xf8: "REBOOT", 0xec: "LOCAL_TIMER"}
CALL_FUNCTION_VECTORS = {0xfc, 0xfb}


@dataclass(frozen=True)
class Thresholds:
    clock_reads_per_s: float = 10.0        # PM timer / HPET reads per VM (after boot: 0)
    tsc_deadline_per_s: float = 100_000.0  # TSC_DEADLINE writes per VM
    pmu_accesses: int = 16                 # PMU MSR accesses + RDPMC exits in the window, per VM
    hlt_per_s: float = 1_000.0             # HLT exits per vCPU
    icr_per_s: float = 10_000.0            # x2APIC ICR writes (IPIs sent) per VM
    mem_faults_per_s: float = 1_000.0      # EPT violations / NPFs without MMIO, per VM
    min_count: int = 20                    # rate rules need this many events (short windows)


def parse_threshold(text: str) -> tuple[str, float]:
    """`NAME=VALUE` (a `Thresholds` field, a positive number) for `diagnose --threshold`;
    ValueError names what is wrong and the fields there are."""
    known = {f.name: f.type for f in fields(Thresholds)}
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or name not in known:
        raise ValueError(f"{text!r}: expected NAME=VALUE with NAME one of {', '.join(known)}")
    try:
        v = float(value)
    except ValueError:
        raise ValueError(f"{name}: {value.strip()!r} is not a number") from None
    if not v > 0 or v == float("inf"):
        raise ValueError(f"{name}: must be a positive number, not {value.strip()}")
    if known[name] in ("int", int):
        if v != int(v):
            raise ValueError(f"{name}: must be a whole number, not {value.strip()}")
        v = int(v)
    return name, v


def with_thresholds(pairs: list[tuple[str, float]] | None, base: Thresholds = Thresholds()) -> Thresholds:
    return replace(base, **dict(pairs or []))


@dataclass(frozen=True)
class Finding:
    rule: str
    vm: str
    title: str
    evidence: tuple[str, ...]
    advice: str
    fix: str                      # the setting that removes it
    data: dict[str, Any] = field(default_factory=dict)
    severity: str = "warning"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["evidence"] = list(self.evidence)
        return d


def _r(x: float) -> str:
    return f"{x:,.0f}/s" if x >= 10 else f"{x:.1f}/s"


def _vcpu(ev: Evidence, tid: int) -> str:
    v = ev.vcpu_of(tid)
    return f"vCPU {v} (tid {tid})" if v is not None else f"tid {tid}"


def _vcpu_list(ev: Evidence, tids: list[int]) -> str:
    vs = sorted(v for t in tids if (v := ev.vcpu_of(t)) is not None)
    return ",".join(map(str, vs)) if vs else "<their vCPU numbers>"


# ------------------------------------------------------------------------ rules

def clocksource(ev: Evidence, vm: str, th: Thresholds) -> list[Finding]:
    reads = Counter()
    for (tid, port, write), n in ev.pio.items():
        if port in PM_TIMER_PORTS and not write:
            reads[port] += n
    hpet = sum(n for (tid, gpa, write), n in ev.mmio.items() if gpa == HPET_COUNTER_GPA and not write)
    total = sum(reads.values()) + hpet
    if ev.rate(total) < th.clock_reads_per_s or total < th.min_count:
        return []
    lines = [f"PIO IN port {port:#x} ({PM_TIMER_PORTS[port]}): {n} reads, {_r(ev.rate(n))}"
             for port, n in sorted(reads.items())]
    if hpet:
        lines.append(f"MMIO read GPA {HPET_COUNTER_GPA:#x} (HPET main counter): {hpet} reads, {_r(ev.rate(hpet))}")
    tids = sorted({t for (t, p, w) in ev.pio if p in PM_TIMER_PORTS and not w})
    lines.append(f"from {len(tids)} vCPU thread(s): " + ", ".join(_vcpu(ev, t) for t in tids[:8]))
    which = "acpi_pm" if reads else "hpet"
    return [Finding(
        "clocksource", vm, f"guest clocksource fell back to {which}: every clock read traps to the host",
        tuple(lines),
        "The guest does not trust its TSC (clocksource watchdog, marginal calibration) and reads "
        f"the {'ACPI PM timer port' if reads else 'HPET'} for every clock_gettime(); each read is a "
        "vm-exit (a userspace exit to QEMU for the PM timer). Boot the guest with "
        "clocksource=tsc tsc=reliable (tsc=reliable also turns the watchdog off so the TSC is "
        "not demoted later); check /sys/devices/system/clocksource/clocksource0/current_clocksource.",
        "guestimages profile `online` (or `online-nodecay`): [clock] cmdline = "
        '["clocksource=tsc", "tsc=reliable"]',
        {"reads": total, "rate_per_s": round(ev.rate(total), 1), "clocksource": which,
         "ports": {f"{p:#x}": n for p, n in sorted(reads.items())}, "hpet_reads": hpet})]


def tsc_deadline(ev: Evidence, vm: str, th: Thresholds) -> list[Finding]:
    per = {tid: n for (tid, ecx, w), n in ev.msr.items() if ecx == TSC_DEADLINE and w}
    total = sum(per.values())
    if ev.rate(total) < th.tsc_deadline_per_s or total < th.min_count:
        return []
    lines = [f"WRMSR {TSC_DEADLINE:#x} IA32_TSC_DEADLINE: {total} writes, {_r(ev.rate(total))} "
             f"(threshold {_r(th.tsc_deadline_per_s)} per VM)"]
    lines += [f"  {_vcpu(ev, t)}: {n}, {_r(ev.rate(n))}" for t, n in sorted(per.items(), key=lambda kv: -kv[1])[:8]]
    return [Finding(
        "tsc-deadline-storm", vm, "TSC_DEADLINE write storm: the guest re-arms its timer at a very high rate",
        tuple(lines),
        "Every hrtimer (re)arm in the guest is a WRMSR to IA32_TSC_DEADLINE, and each is an exit "
        "(handled in KVM's fastpath on VMX, still ~1-2 us of lost guest time). Rates like this come "
        "from timer-heavy guests: TCP BBR (and fq pacing) arms a pacing hrtimer per paced flow, "
        "high-rate nanosleep/epoll timeouts, busy NOHZ tick re-arming. In the guest check "
        "`sysctl net.ipv4.tcp_congestion_control`, `tc qdisc show` (fq) and "
        "`perf stat -e timer:hrtimer_start -a sleep 1`; coarser pacing (a larger fq `timer_slack`, "
        "or a congestion control without pacing where it is not needed) or coalesced application "
        "timers lower the rate. This is guest behaviour, not a host misconfiguration.",
        "no guestimages profile setting covers this: a per-service choice (congestion control, fq "
        "timer_slack, timer coalescing in the application)",
        {"writes": total, "rate_per_s": round(ev.rate(total), 1),
         "per_vcpu": {str(ev.vcpu_of(t) if ev.vcpu_of(t) is not None else f"tid{t}"): n for t, n in per.items()}})]


def vpmu(ev: Evidence, vm: str, th: Thresholds) -> list[Finding]:
    msrs = Counter()
    for (tid, ecx, w), n in ev.msr.items():
        if ecx in PMU_MSRS:
            msrs[(ecx, w)] += n
    rdpmc = sum(n for (tid, r), n in ev.exits.items() if r in RDPMC_REASONS)
    total = sum(msrs.values()) + rdpmc
    if total < th.pmu_accesses:
        return []
    lines = [f"{'WRMSR' if w else 'RDMSR'} {ecx:#x} {msr_name(ecx)}: {n}"
             for (ecx, w), n in sorted(msrs.items(), key=lambda kv: (-kv[1], kv[0]))[:10]]
    if rdpmc:
        lines.append(f"RDPMC exits: {rdpmc}")
    tids = sorted({t for (t, e, w) in ev.msr if e in PMU_MSRS})
    lines.append(f"on {len(tids)} vCPU thread(s)")
    bursts, period = pmu_period_s(t for ts in ev.pmu_times.values() for t in ts)
    if period is not None:
        lines.append(f"in {bursts} bursts, one every {period:g} s (a sampling tool's interval)")
    return [Finding(
        "vpmu-sampling", vm, "periodic vPMU MSR exits: something in the guest samples hardware counters",
        tuple(lines),
        "Programming and reading the virtual PMU traps on every access (counter MSRs, "
        "IA32_PERF_GLOBAL_CTRL, RDPMC). A monitoring agent that reads IPC/cycles every interval "
        "(atop 2.8 perfevents, perf stat, node exporters) causes these bursts on every vCPU. "
        "Disable PMU collection in the guest (/etc/atoprc: `perfevents disable`), or give the VM "
        "no vPMU (libvirt `<pmu state='off'/>`) when nobody needs guest counters.",
        "guestimages profile `online`: [atop] perfevents = \"disable\"",
        {"accesses": total, "rdpmc_exits": rdpmc, "bursts": bursts, "period_s": period,
         "msrs": {f"{e:#x}/{'W' if w else 'R'}": n for (e, w), n in sorted(msrs.items())}})]


def hlt_wakeups(ev: Evidence, vm: str, th: Thresholds) -> list[Finding]:
    hlt: Counter = Counter()
    extint: Counter = Counter()
    for (tid, r), n in ev.exits.items():
        if r in HLT_REASONS:
            hlt[tid] += n
        elif r in EXTINT_REASONS:
            extint[tid] += n
    hot = sorted(t for t, n in hlt.items() if ev.rate(n) >= th.hlt_per_s and n >= th.min_count)
    if not hot:
        return []
    lines = [f"{_vcpu(ev, t)}: HLT {hlt[t]} ({_r(ev.rate(hlt[t]))}), wake-ups {ev.wakeups[t]} "
             f"({_r(ev.rate(ev.wakeups[t]))}), external interrupts {extint[t]} ({_r(ev.rate(extint[t]))})"
             for t in hot]
    vcpus = _vcpu_list(ev, hot)
    all_vcpus = {t for (t, _r_) in ev.exits}
    spread = len(all_vcpus) > 1 and set(hot) == all_vcpus
    advice = ("Each HLT exit puts the vCPU to sleep on the host and each interrupt wakes it again: "
              "exit + wake-up latency on every packet or timer. Poll briefly in the guest's idle loop "
              f"on these vCPUs: `nohlt_list={vcpus}` with the kernel-patches/ guest kernel, or the "
              "upstream cpuidle-haltpoll driver (cpuidle_haltpoll.force=1, bounded by guest_halt_poll_ns).")
    if spread:
        advice += (" HLT is high on every vCPU: device interrupts are spread over all of them; confine "
                   "them to the IRQ vCPUs first (irqaffinity=, virtio IRQ affinity) so only those need to poll.")
    return [Finding(
        "hlt-wakeups", vm, f"HLT exits and wake-ups at high rates on vCPU(s) {vcpus}", tuple(lines), advice,
        "guestimages profile `online`: [idle] poll = \"irq-vcpus\" ([idle.haltpoll] guest_halt_poll_ns = "
        "200000)" + ("; [irq] irqaffinity = true, virtio_affinity = true" if spread else ""),
        {"vcpus": {str(ev.vcpu_of(t) if ev.vcpu_of(t) is not None else f"tid{t}"):
                   {"hlt": hlt[t], "wakeups": ev.wakeups[t], "external_interrupts": extint[t]} for t in hot},
         "spread_over_all_vcpus": spread})]


def ipi_storm(ev: Evidence, vm: str, th: Thresholds) -> list[Finding]:
    per = {tid: n for (tid, ecx, w), n in ev.msr.items() if ecx == X2APIC_ICR and w}
    total = sum(per.values())
    if ev.rate(total) < th.icr_per_s or total < th.min_count:
        return []
    vec: Counter = Counter()
    for (tid, v), n in ev.icr_vectors.items():
        vec[v] += n
    lines = [f"WRMSR {X2APIC_ICR:#x} X2APIC_ICR (IPIs sent): {total}, {_r(ev.rate(total))}"]
    lines += [f"  vector {v:#x} {IPI_VECTORS.get(v, '')}: {n}" for v, n in vec.most_common(5)]
    lines += [f"  from {_vcpu(ev, t)}: {n}" for t, n in sorted(per.items(), key=lambda kv: -kv[1])[:4]]
    callfn = sum(n for v, n in vec.items() if v in CALL_FUNCTION_VECTORS)
    resched = vec.get(0xfd, 0)
    advice = ("Each IPI the guest sends is a WRMSR to the x2APIC ICR and an exit, plus a wake-up exit "
              "on the target vCPU. ")
    if callfn >= resched:
        advice += ("Most are CALL_FUNCTION IPIs: TLB shootdowns, typically from an allocator returning "
                   "memory with madvise() while the process runs threads on other vCPUs (jemalloc decay "
                   "purging). Lengthen or disable jemalloc decay (MALLOC_CONF).")
    else:
        advice += ("Most are RESCHEDULE IPIs: wake-ups of idle (halted) vCPUs; a vCPU that polls in idle "
                   "needs no IPI to be woken (see the idle setting).")
    fix = ("guestimages profile `online`: [malloc] conf = \"dirty_decay_ms:60000,muzzy_decay_ms:60000\" "
           "(MALLOC_CONF), or profile `online-nodecay` (decay disabled)") if callfn >= resched else \
        "guestimages profile `online`: [idle] poll = \"irq-vcpus\""
    return [Finding("ipi-storm", vm, "x2APIC ICR write storm: the guest sends IPIs at a high rate",
                    tuple(lines), advice, fix,
                    {"writes": total, "rate_per_s": round(ev.rate(total), 1),
                     "vectors": {f"{v:#x}": n for v, n in sorted(vec.items())}})]


def mem_faults(ev: Evidence, vm: str, th: Thresholds) -> list[Finding]:
    total = sum(ev.mem_faults.values())
    if ev.rate(total) < th.mem_faults_per_s or total < th.min_count:
        return []
    misconfig = sum(n for (t, r), n in ev.exits.items() if r == "EPT_MISCONFIG")
    reasons = sorted({r for (t, r) in ev.exits if r in ("EPT_VIOLATION", "npf")})
    lines = [f"{'/'.join(reasons) or 'EPT_VIOLATION'} exits without MMIO (guest RAM faults): {total}, "
             f"{_r(ev.rate(total))}"]
    if misconfig:
        lines.append(f"EPT_MISCONFIG {misconfig} not counted (MMIO emulation, not RAM)")
    return [Finding(
        "memory-faults", vm, "guest RAM faults at a high rate: hugepages are not backing guest memory",
        tuple(lines),
        "EPT violations / nested page faults on guest RAM mean the host maps guest memory in 4 KiB "
        "pages (or keeps unmapping it: THP splits, KSM, swap, NUMA balancing). With 2 MiB/1 GiB "
        "HugeTLB backing each region faults once. Check the domain's <memoryBacking><hugepages/> "
        "and the host's HugePages_Free / nr_hugepages; right after boot first-touch faults are "
        "expected, so re-run once the guest is warm.",
        "hostd: guest RAM from the HugeTLB pool (libvirt <memoryBacking><hugepages/>); no guestimages setting",
        {"faults": total, "rate_per_s": round(ev.rate(total), 1), "ept_misconfig": misconfig})]


RULES = (clocksource, tsc_deadline, vpmu, hlt_wakeups, ipi_storm, mem_faults)
#: rules that need kvm_exit (reason names), and the others' parts that do
EXIT_RULES = ("hlt-wakeups", "memory-faults")


@dataclass(frozen=True)
class Diagnosis:
    duration_s: float
    source: str
    vms: tuple[dict[str, Any], ...]
    findings: tuple[Finding, ...]
    not_evaluated: tuple[dict[str, str], ...]
    thresholds: Thresholds = Thresholds()
    lost_events: int = 0

    def changed_thresholds(self) -> dict[str, float]:
        """The thresholds set away from their defaults (`--threshold`)."""
        default = Thresholds()
        return {f.name: getattr(self.thresholds, f.name) for f in fields(Thresholds)
                if getattr(self.thresholds, f.name) != getattr(default, f.name)}

    def to_dict(self) -> dict[str, Any]:
        return {"duration_s": round(self.duration_s, 3), "source": self.source, "vms": list(self.vms),
                "findings": [f.to_dict() for f in self.findings], "not_evaluated": list(self.not_evaluated),
                "thresholds": asdict(self.thresholds), "lost_events": self.lost_events}


def diagnose(ev: Evidence, th: Thresholds = Thresholds(), vm: str | None = None) -> Diagnosis:
    """All rules over every VM (or only `vm`) of the evidence."""
    vms = [vm] if vm else ev.vms()
    findings: list[Finding] = []
    summary = []
    for name in vms:
        sub = ev.only_vm(name)
        events = (sum(sub.msr.values()) + sum(sub.pio.values()) + sum(sub.mmio.values())
                  + sum(sub.user_exits.values()))
        summary.append({"vm": name, "vcpu_threads": len(sub.tids()), "exits": sub.total_exits(),
                        "exit_rate_per_s": round(sub.rate(sub.total_exits()), 1),
                        "access_events": events})
        for rule in RULES:
            findings.extend(rule(sub, name, th))
    not_eval = []
    if not ev.saw_exits:
        why = ("no kvm_exit events in the input (a software hypervisor such as PVM never emits them, "
               "or they were not recorded): HLT and memory-fault rules, and RDPMC exits, not evaluated")
        not_eval = [{"rule": r, "why": why} for r in EXIT_RULES]
    return Diagnosis(ev.duration_s, ev.source, tuple(summary), tuple(findings), tuple(not_eval), th,
                     ev.lost_events)
