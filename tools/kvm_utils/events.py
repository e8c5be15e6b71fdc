"""The raw kvm events every source produces, one frozen dataclass per tracepoint kind.

`tid` is the thread that hit the tracepoint (the vCPU thread for exit-path events),
`ts_ns` the trace timestamp in nanoseconds (ftrace text has microsecond resolution).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exit:
    tid: int
    ts_ns: int
    reason: str          # printed name, e.g. "EPT_VIOLATION", "npf", "UNKNOWN(0x4d)"
    vcpu: int | None     # absent in the 4.19-5.9 format
    task: str = ""


@dataclass(frozen=True)
class Entry:
    tid: int
    ts_ns: int
    vcpu: int | None


@dataclass(frozen=True)
class Msr:
    tid: int
    ts_ns: int
    ecx: int
    write: bool
    data: int
    gp: bool = False     # the access raised #GP in the guest


@dataclass(frozen=True)
class Pio:
    tid: int
    ts_ns: int
    port: int
    write: bool
    size: int
    count: int
    val: int


@dataclass(frozen=True)
class Mmio:
    tid: int
    ts_ns: int
    gpa: int
    write: bool
    length: int
    val: int
    fast: bool = False        # kvm_fast_mmio (ioeventfd write, no decode)
    unsatisfied: bool = False  # read forwarded to userspace; a "read" event completes it


@dataclass(frozen=True)
class UserspaceExit:
    tid: int
    ts_ns: int
    reason: str          # "IO", "HLT", "MMIO", ... ; "restart"/"error" for errno cases


@dataclass(frozen=True)
class Wakeup:
    """kvm_vcpu_wakeup: a halted vCPU woke up (`waited`: it slept; else halt-polling caught it)."""

    tid: int
    ts_ns: int
    ns: int
    waited: bool
    valid: bool


Event = Exit | Entry | Msr | Pio | Mmio | UserspaceExit | Wakeup
