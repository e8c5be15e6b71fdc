"""What the kprobe engine (sources/kprobe.py) attaches, per purpose, kernel version range and vendor.

`resolve` is pure: given a kernel version, a vendor (vmx/svm/pvm) and the set of function
names the kernel has (kallsyms and/or BTF), it says per probe which symbol it will use, or
names the missing symbol and what is lost without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VENDORS = ("vmx", "svm", "pvm")
ALL = frozenset(VENDORS)
Version = tuple[int, int]


@dataclass(frozen=True)
class Candidate:
    symbol: str
    vendors: frozenset[str] = ALL
    since: Version = (0, 0)          # first kernel (major, minor) with it
    until: Version | None = None     # first kernel without it


@dataclass(frozen=True)
class Probe:
    purpose: str
    role: str
    candidates: tuple[Candidate, ...]
    lost: str                        # what the engine cannot show without it


TABLE: tuple[Probe, ...] = (
    Probe("exit-handling", "exit handler entry to return",
          (Candidate("vmx_handle_exit", frozenset({"vmx"})), Candidate("svm_handle_exit", frozenset({"svm"})),
           Candidate("pvm_handle_exit", frozenset({"pvm"}))),
          "time spent handling each exit, per reason"),
    Probe("wakeups", "vCPU wake-up", (Candidate("kvm_vcpu_wake_up", since=(4, 5)),),
          "who woke which vCPU and how long it had slept"),
    Probe("wakeups", "vCPU kick", (Candidate("kvm_vcpu_kick"),),
          "kicks of running vCPUs (IPIs to force an exit)"),
    Probe("wakeups", "posted-interrupt wake-up",
          (Candidate("pi_wakeup_handler", frozenset({"vmx"}), since=(5, 6)),
           Candidate("wakeup_handler", frozenset({"vmx"}), until=(5, 6))),
          "posted-interrupt wake-ups of blocked vCPUs"),
    Probe("timer", "LAPIC hrtimer expiry", (Candidate("apic_timer_fn"),),
          "LAPIC timer expiries on the host hrtimer (TSC-deadline storms seen from the host)"),
    Probe("timer", "VMX preemption-timer expiry",
          (Candidate("kvm_lapic_expired_hv_timer", frozenset({"vmx"}), since=(4, 10)),),
          "LAPIC timer expiries through the VMX preemption timer"),
    Probe("halt-spin", "halt duration",
          (Candidate("kvm_vcpu_halt", since=(5, 17)), Candidate("kvm_vcpu_block", until=(5, 17))),
          "how long vCPUs halt"),
    Probe("halt-spin", "pause-loop exit", (Candidate("kvm_vcpu_on_spin"),),
          "pause-loop exits (vCPUs spinning on a lock held by a preempted vCPU)"),
)


@dataclass(frozen=True)
class ProbeResolution:
    probe: Probe
    status: str               # "found", "missing" or "n/a" (no candidate for this vendor and version)
    symbol: str | None        # what the engine will attach; None unless found
    message: str


@dataclass(frozen=True)
class Resolution:
    kernel: Version
    vendor: str
    probes: tuple[ProbeResolution, ...]

    def missing(self) -> list[ProbeResolution]:
        return [p for p in self.probes if p.status == "missing"]

    def servable(self) -> list[str]:
        """Purposes with every applicable probe resolved."""
        out: list[str] = []
        for purpose in dict.fromkeys(p.probe.purpose for p in self.probes):
            rows = [p for p in self.probes if p.probe.purpose == purpose]
            if any(p.status == "found" for p in rows) and all(p.status != "missing" for p in rows):
                out.append(purpose)
        return out


def parse_version(release: str) -> Version:
    """(major, minor) of a `uname -r` string such as 6.18.44-fc-v669."""
    m = re.match(r"(\d+)\.(\d+)", release)
    if not m:
        raise ValueError(f"kernel release {release!r} does not start with MAJOR.MINOR")
    return int(m.group(1)), int(m.group(2))


def _applies(c: Candidate, kernel: Version, vendor: str) -> bool:
    return vendor in c.vendors and c.since <= kernel and (c.until is None or kernel < c.until)


def resolve(kernel: Version, vendor: str, available: frozenset[str]) -> Resolution:
    if vendor not in VENDORS:
        raise ValueError(f"vendor {vendor!r} is not one of {', '.join(VENDORS)}")
    out: list[ProbeResolution] = []
    for probe in TABLE:
        wanted = [c for c in probe.candidates if _applies(c, kernel, vendor)]
        if not wanted:
            out.append(ProbeResolution(probe, "n/a", None, f"not applicable to {vendor} on "
                                       f"{kernel[0]}.{kernel[1]}: no such probe there ({probe.lost})"))
            continue
        found = next((c for c in wanted if c.symbol in available), None)
        if found:
            out.append(ProbeResolution(probe, "found", found.symbol, f"{probe.purpose}: {found.symbol}"))
        else:
            names = " or ".join(c.symbol for c in wanted)
            out.append(ProbeResolution(probe, "missing", None, f"missing {names} ({probe.role}): "
                                       f"without it, no {probe.lost}"))
    return Resolution(kernel, vendor, tuple(out))


def engine_vendor(cpu_vendor: str | None, available: frozenset[str]) -> str | None:
    """vmx/svm from the CPU flag (host_vendor's intel/amd); pvm when neither and the kernel has PVM."""
    if cpu_vendor == "intel":
        return "vmx"
    if cpu_vendor == "amd":
        return "svm"
    return "pvm" if "pvm_handle_exit" in available else None
