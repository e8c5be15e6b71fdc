"""Write the `diag-*` traces: representative recordings of each pathology `kvm-utils
diagnose` knows, in the kernel's exact print formats (arch/x86/kvm/trace.h and
include/trace/events/kvm.h of the named kernel), plus a clean trace of a tuned guest.

They are not live captures (this machine's PVM /dev/kvm never emits kvm_exit): every
timestamp and count is chosen so tests can check rates by hand. Deterministic: running
this again must reproduce the files byte for byte (a test checks it).

    .venv/bin/python tests/data/traces/make_diagnose_traces.py [--check]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

TRACE_HEADER = """# tracer: nop
#
# entries-in-buffer/entries-written: {n}/{n}   #P:4
#
#                                _-----=> irqs-off/BH-disabled
#                               / _----=> need-resched
#                              | / _---=> hardirq/softirq
#                              || / _--=> preempt-depth
#                              ||| / _-=> migrate-disable
#                              |||| /     delay
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
#              | |         |   |||||     |         |
"""


class Trace:
    """Lines of one trace; `fmt` picks the kvm_exit/kvm_entry generation and line layout."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt          # "5.15" (trace), "6.1" (trace), "4.19" (trace_pipe)
        self.lines: list[tuple[int, str]] = []   # (ts_us, line)

    def _line(self, tid: int, vcpu: int, ts_us: int, flags: str, event: str, body: str) -> None:
        task = f"CPU {vcpu}/KVM-{tid}"
        cpu = vcpu % 4
        ts = f"{ts_us // 1_000_000}.{ts_us % 1_000_000:06d}"
        if self.fmt == "4.19":
            flags4 = flags[:4]
            self.lines.append((ts_us, f"{task:>16}  [{cpu:03d}] {flags4} {ts:>12}: {event}: {body}"))
        else:
            self.lines.append((ts_us, f"{task:>18}    [{cpu:03d}] {flags} {ts:>12}: {event}: {body}"))

    def exit(self, tid: int, vcpu: int, ts: int, reason: str, rip: int, info1: int = 0, info2: int = 0,
             intr_info: int = 0) -> None:
        if self.fmt == "4.19":
            body = f"reason {reason} rip {rip:#x} info {info1:x} {info2:x}"
        else:
            body = (f"vcpu {vcpu} reason {reason} rip {rip:#x} info1 0x{info1:016x} info2 0x{info2:016x} "
                    f"intr_info 0x{intr_info:08x} error_code 0x00000000")
        self._line(tid, vcpu, ts, "d..1.", "kvm_exit", body)

    def entry(self, tid: int, vcpu: int, ts: int, rip: int) -> None:
        body = f"vcpu {vcpu}" if self.fmt == "4.19" else f"vcpu {vcpu}, rip {rip:#x}"
        self._line(tid, vcpu, ts, "d..1.", "kvm_entry", body)

    def msr(self, tid: int, vcpu: int, ts: int, ecx: int, write: bool, data: int) -> None:
        self._line(tid, vcpu, ts, ".....", "kvm_msr", f"msr_{'write' if write else 'read'} {ecx:x} = {data:#x}")

    def pio(self, tid: int, vcpu: int, ts: int, port: int, write: bool, size: int, val: int) -> None:
        self._line(tid, vcpu, ts, ".....", "kvm_pio",
                   f"pio_{'write' if write else 'read'} at {port:#x} size {size} count 1 val {val:#x} ")

    def mmio(self, tid: int, vcpu: int, ts: int, kind: str, gpa: int, length: int, val: int) -> None:
        self._line(tid, vcpu, ts, ".....", "kvm_mmio", f"mmio {kind} len {length} gpa {gpa:#x} val {val:#x}")

    def user_exit(self, tid: int, vcpu: int, ts: int, name: str, code: int) -> None:
        self._line(tid, vcpu, ts, ".....", "kvm_userspace_exit", f"reason KVM_EXIT_{name} ({code})")

    def wakeup(self, tid: int, vcpu: int, ts: int, ns: int) -> None:
        self._line(tid, vcpu, ts, ".....", "kvm_vcpu_wakeup", f"wait time {ns} ns, polling valid")

    def ipi(self, tid: int, vcpu: int, ts: int, dst: int, vec: int) -> None:
        self._line(tid, vcpu, ts, ".....", "kvm_apic_ipi",
                   f"dst {dst:x} vec {vec} (Fixed|physical|de-assert|edge|dst)")

    def text(self, header: bool = True) -> str:
        body = [ln for _, ln in sorted(self.lines, key=lambda x: x[0])]
        head = TRACE_HEADER.format(n=len(body)) if header and self.fmt != "4.19" else ""
        return head + "\n".join(body) + "\n"


T0 = 4_000_000_000   # us: 4000 s after boot
RIP_CLOCK = 0xffffffff8104b5a6
RIP_TIMER = 0xffffffff8107d4a4
RIP_IDLE = 0xffffffff81c0c6f4


def background(t: Trace, tid: int, vcpu: int, start: int, n: int, every: int) -> None:
    """Ordinary timer re-arms and EOIs of a healthy guest (TSC_DEADLINE + x2APIC EOI)."""
    for i in range(n):
        ts = start + i * every
        t.exit(tid, vcpu, ts, "MSR_WRITE", RIP_TIMER)
        ecx, data = (0x6e0, 0x2c1f0e9a3b40 + i * 2_600_000) if i % 2 == 0 else (0x80b, 0)
        t.msr(tid, vcpu, ts + 1, ecx, True, data)
        t.entry(tid, vcpu, ts + 2, RIP_TIMER + 2)


def acpi_pm() -> str:
    """Guest on acpi_pm (q35): 2 vCPUs read port 0x608 every 100 us for 10 ms -> 200 reads,
    ~20,000/s; each read is an IO_INSTRUCTION exit completed by QEMU (KVM_EXIT_IO)."""
    t = Trace("5.15")
    for vcpu, tid in ((0, 6101), (1, 6102)):
        for i in range(100):
            ts = T0 + vcpu * 50 + i * 100
            t.exit(tid, vcpu, ts, "IO_INSTRUCTION", RIP_CLOCK, 0x6080048)
            t.user_exit(tid, vcpu, ts + 1, "IO", 2)
            t.pio(tid, vcpu, ts + 9, 0x608, False, 4, 0x3a9c01 + i * 358)
            t.entry(tid, vcpu, ts + 10, RIP_CLOCK + 2)
    return t.text()


def tsc_deadline() -> str:
    """A BBR/fq-paced sender: 4 vCPUs write IA32_TSC_DEADLINE every 25 us for 3.75 ms -> 600
    writes, ~160,000/s per VM. Recorded with only kvm:kvm_msr
    enabled (`trace-cmd record -e kvm:kvm_msr`), as one does for a storm."""
    t = Trace("5.15")
    for vcpu in range(4):
        tid = 7101 + vcpu
        for i in range(150):
            ts = T0 + vcpu * 6 + i * 25
            t.msr(tid, vcpu, ts, 0x6e0, True, 0x2c1f0e9a3b40 + i * 65_000)
    return t.text()


def vpmu() -> str:
    """atop 2.8 with perfevents on, `atop 1`: once a second, on each of 2 vCPUs, the guest
    kernel reprograms the counters (PERF_GLOBAL_CTRL off, FIXED_CTR_CTRL, EVNTSEL0, PMC0,
    GLOBAL_CTRL on) and reads them (RDPMC x2). 3 rounds over 2 s."""
    t = Trace("5.15")
    seq = [(0x38f, True, 0x0), (0x38d, True, 0xb0), (0x186, True, 0x53003c), (0xc1, True, 0x0),
           (0x38f, True, 0x70000000f)]
    for r in range(3):
        for vcpu in range(2):
            tid, ts = 8101 + vcpu, T0 + r * 1_000_000 + vcpu * 200
            for ecx, w, data in seq:
                t.exit(tid, vcpu, ts, "MSR_WRITE", 0xffffffff81011c3a)
                t.msr(tid, vcpu, ts + 1, ecx, w, data)
                t.entry(tid, vcpu, ts + 2, 0xffffffff81011c3c)
                ts += 5
            for _ in range(2):
                t.exit(tid, vcpu, ts, "RDPMC", 0xffffffff81013f10)
                t.entry(tid, vcpu, ts + 1, 0xffffffff81013f12)
                ts += 5
    for vcpu in range(2):
        background(t, 8101 + vcpu, vcpu, T0 + 300_000 + vcpu * 7, 10, 150_000)
    return t.text()


def hlt() -> str:
    """4.19 guest, IRQ vCPU 0 takes network interrupts: HLT -> wake-up (kvm_vcpu_wakeup)
    -> EXTERNAL_INTERRUPT-driven EOI, every 200 us for 20 ms -> 100 HLT, 5,000/s on vCPU 0;
    vCPU 1 runs the service (a few timer exits). trace_pipe output (no header)."""
    t = Trace("4.19")
    tid = 9101
    for i in range(100):
        ts = T0 + i * 200
        t.exit(tid, 0, ts, "HLT", RIP_IDLE)
        t.wakeup(tid, 0, ts + 150, 148_000)
        t.entry(tid, 0, ts + 151, RIP_IDLE + 1)
        t.exit(tid, 0, ts + 160, "MSR_WRITE", RIP_TIMER)
        t.msr(tid, 0, ts + 161, 0x80b, True, 0)
        t.entry(tid, 0, ts + 162, RIP_TIMER + 2)
    background(t, 9102, 1, T0 + 33, 8, 2_400)
    return t.text()


def ipi() -> str:
    """A jemalloc-purging service on a 4-vCPU VM (kvm-utils record file with VM names):
    vCPU 0 sends CALL_FUNCTION (0xfc) IPIs to vCPUs 1-3 every 60 us for 12 ms -> 200 ICR
    writes, ~16,700/s, plus a few RESCHEDULE (0xfd)."""
    t = Trace("6.1")
    tid0 = 5301
    for i in range(200):
        ts = T0 + i * 60
        vec = 0xfd if i % 10 == 9 else 0xfc
        dst = 1 + i % 3
        t.exit(tid0, 0, ts, "MSR_WRITE", 0xffffffff81077b2c)
        t.ipi(tid0, 0, ts, dst, vec)
        t.msr(tid0, 0, ts, 0x830, True, (dst << 32) | vec)
        t.entry(tid0, 0, ts + 1, 0xffffffff81077b2e)
    span_s = 199 * 60 / 1e6 + 1e-6
    header = {"version": 1, "kernel": "6.1.0-26-amd64", "vendor": "intel", "started": 1732350000.0,
              "duration_s": round(span_s, 6), "events": ["kvm_exit", "kvm_entry", "kvm_msr"],
              "threads": {str(tid0 + v): {"vcpu": v, "vm": "web1"} for v in range(4)}, "lost_events": 0}
    return "# kvm-utils-record " + json.dumps(header, sort_keys=True) + "\n" + t.text(header=False)


def ept() -> str:
    """AMD 6.1 host, guest RAM on 4 KiB pages: 2 vCPUs take nested page faults (npf) every
    400 us for 40 ms -> 200 RAM faults, 5,000/s; 20 other npf exits are MMIO (a kvm_mmio
    write to a virtio BAR inside the exit) and must not count."""
    t = Trace("6.1")
    for vcpu, tid in ((0, 3401), (1, 3402)):
        for i in range(100):
            ts = T0 + vcpu * 100 + i * 400
            gpa = 0x1_2340_0000 + (vcpu * 100 + i) * 0x1000
            t.exit(tid, vcpu, ts, "npf", 0xffffffff81a2f3c1, 0x100000006, gpa)
            t.entry(tid, vcpu, ts + 3, 0xffffffff81a2f3c1)
        for i in range(10):
            ts = T0 + vcpu * 100 + i * 4000 + 200
            t.exit(tid, vcpu, ts, "npf", 0xffffffff81733a10, 0x100000007, 0xfebd1000)
            t.mmio(tid, vcpu, ts + 1, "write", 0xfebd1000, 4, 1)
            t.entry(tid, vcpu, ts + 5, 0xffffffff81733a13)
    return t.text()


def clean() -> str:
    """A guest on the `online` profile over 100 ms, 2 vCPUs: timer re-arms and EOIs at
    ~500/s per vCPU, vCPU 1 halts 30 times (300/s), 5 RAM faults and 5 MMIO writes, 4
    RESCHEDULE IPIs; no PM timer, no vPMU. diagnose must find nothing."""
    t = Trace("5.15")
    for vcpu, tid in ((0, 2101), (1, 2102)):
        background(t, tid, vcpu, T0 + vcpu * 3, 50, 2_000)
    for i in range(30):
        ts = T0 + 1_000 + i * 3_300
        t.exit(2102, 1, ts, "HLT", RIP_IDLE)
        t.wakeup(2102, 1, ts + 900, 898_000)
        t.entry(2102, 1, ts + 901, RIP_IDLE + 1)
    for i in range(5):
        ts = T0 + 1_500 + i * 19_000
        t.exit(2101, 0, ts, "EPT_VIOLATION", 0xffffffff81a2f3c1, 0x182, 0x7f3a1000 + i * 0x1000)
        t.entry(2101, 0, ts + 4, 0xffffffff81a2f3c1)
        t.exit(2101, 0, ts + 500, "EPT_MISCONFIG", 0xffffffff81733a10, 0, 0xfebd1000)
        t.mmio(2101, 0, ts + 501, "write", 0xfebd1000, 4, 0)
        t.entry(2101, 0, ts + 505, 0xffffffff81733a13)
        if i < 4:
            t.exit(2101, 0, ts + 900, "MSR_WRITE", 0xffffffff81077b2c)
            t.msr(2101, 0, ts + 900, 0x830, True, (1 << 32) | 0xfd)
            t.entry(2101, 0, ts + 901, 0xffffffff81077b2e)
    return t.text()


FILES = {
    "diag-acpi-pm-intel-5.15-trace.txt": acpi_pm,
    "diag-tsc-deadline-intel-5.15-msr-only.txt": tsc_deadline,
    "diag-vpmu-intel-5.15-trace.txt": vpmu,
    "diag-hlt-intel-4.19-trace_pipe.txt": hlt,
    "diag-ipi-intel-6.1.kvmu": ipi,
    "diag-npf-amd-6.1-trace.txt": ept,
    "diag-clean-intel-5.15-trace.txt": clean,
}


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for name, make in FILES.items():
        text = make()
        path = HERE / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("stale: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
