"""Parse ftrace text: `/sys/kernel/tracing/trace`, `trace_pipe` and `trace-cmd report`.

One line is `TASK-TID [(TGID)] [CPU] [FLAGS] SECONDS: EVENT: BODY`; TASK may contain spaces
and slashes (`CPU 0/KVM-4101`). Bodies follow the kernel's print formats in
`arch/x86/kvm/trace.h`, including both kvm_exit generations:

- 4.19-5.9: `reason EPT_VIOLATION rip 0xffffffff8104b5a6 info 181 0`
- 5.10+:    `vcpu 0 reason EPT_VIOLATION rip 0x... info1 0x... info2 0x... intr_info 0x...
            error_code 0x...` (6.x appends `requests 0x...`)

Lines that are not kvm events (headers, other tracepoints, `CPU:1 [LOST 12 EVENTS]`) are
skipped, never fatal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tools.kvm_utils.arch import Vendor, exit_reason_name, unknown, vendor_of_reason_name
from tools.kvm_utils.events import Entry, Event, Exit, Mmio, Msr, Pio, UserspaceExit, Wakeup

_LINE = re.compile(
    r"^\s*(?P<task>.*?)-(?P<tid>\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[(?P<cpu>\d+)\]\s+"
    r"(?:[A-Za-z.\d]{4,6}\s+)?(?P<ts>\d+(?:\.\d+)?):\s+(?P<event>\w+):\s*(?P<body>.*?)\s*$"
)
_EXIT_NEW = re.compile(r"^vcpu (\d+) reason (.+?) rip 0x[0-9a-f]+ info1 ")
_EXIT_OLD = re.compile(r"^reason (.+?) rip 0x[0-9a-f]+ info [0-9a-f]+ [0-9a-f]+")
_ENTRY = re.compile(r"^vcpu (\d+)")
_MSR = re.compile(r"^msr_(read|write) ([0-9a-f]+) = 0x([0-9a-f]+)(\s*\(#GP\))?")
_PIO = re.compile(r"^pio_(read|write) at 0x([0-9a-f]+) size (\d+) count (\d+) val 0x([0-9a-f]+)")
_MMIO = re.compile(r"^mmio (unsatisfied-read|read|write) len (\d+) gpa 0x([0-9a-f]+) val 0x([0-9a-f]+)")
_FAST_MMIO = re.compile(r"^fast mmio at gpa 0x([0-9a-f]+)")
_USER_EXIT = re.compile(r"^reason (\S+) \((-?\d+)\)")
_WAKEUP = re.compile(r"^(wait|poll) time (-?\d+) ns, polling (valid|invalid)")
_VCPU_TASK = re.compile(r"^CPU (\d+)/KVM$")
_HEX_REASON = re.compile(r"^0x([0-9a-f]+)$")

KVM_EVENTS = ("kvm_exit", "kvm_entry", "kvm_msr", "kvm_pio", "kvm_mmio", "kvm_fast_mmio",
              "kvm_userspace_exit", "kvm_vcpu_wakeup")


@dataclass(frozen=True)
class Line:
    """A parsed ftrace line header plus its kvm event (None when not a kvm event)."""

    task: str
    tid: int
    ts_ns: int
    event: Event | None


def ts_to_ns(text: str) -> int:
    """`10765.034835` (us, trace) or `10765.034835123` (ns, trace-cmd -t) -> ns, exactly."""
    sec, _, frac = text.partition(".")
    return int(sec) * 1_000_000_000 + int((frac + "000000000")[:9])


def vcpu_of_task(task: str) -> int | None:
    """QEMU names vCPU threads `CPU N/KVM`; None for any other thread."""
    m = _VCPU_TASK.match(task)
    return int(m.group(1)) if m else None


def _reason(text: str, vendor: Vendor | None) -> str:
    m = _HEX_REASON.match(text)
    if m:   # __print_symbolic prints a code missing from the kernel's table as hex
        return exit_reason_name(vendor, int(m.group(1), 16)) if vendor else unknown(int(m.group(1), 16))
    return text


def parse_body(event: str, body: str, tid: int, ts_ns: int, vendor: Vendor | None = None,
               task: str = "") -> Event | None:
    """Turn one kvm tracepoint body into an event; None when the body is not understood."""
    if event == "kvm_exit":
        m = _EXIT_NEW.match(body)
        if m:
            return Exit(tid, ts_ns, _reason(m.group(2), vendor), int(m.group(1)), task)
        m = _EXIT_OLD.match(body)
        if m:
            return Exit(tid, ts_ns, _reason(m.group(1), vendor), vcpu_of_task(task), task)
    elif event == "kvm_entry":
        m = _ENTRY.match(body)
        if m:
            return Entry(tid, ts_ns, int(m.group(1)))
    elif event == "kvm_msr":
        m = _MSR.match(body)
        if m:
            return Msr(tid, ts_ns, int(m.group(2), 16), m.group(1) == "write",
                       int(m.group(3), 16), bool(m.group(4)))
    elif event == "kvm_pio":
        m = _PIO.match(body)
        if m:
            return Pio(tid, ts_ns, int(m.group(2), 16), m.group(1) == "write", int(m.group(3)),
                       int(m.group(4)), int(m.group(5), 16))
    elif event == "kvm_mmio":
        m = _MMIO.match(body)
        if m:
            kind = m.group(1)
            return Mmio(tid, ts_ns, int(m.group(3), 16), kind == "write", int(m.group(2)),
                        int(m.group(4), 16), unsatisfied=kind == "unsatisfied-read")
    elif event == "kvm_fast_mmio":
        m = _FAST_MMIO.match(body)
        if m:
            return Mmio(tid, ts_ns, int(m.group(1), 16), True, 0, 0, fast=True)
    elif event == "kvm_userspace_exit":
        m = _USER_EXIT.match(body)
        if m:
            return UserspaceExit(tid, ts_ns, m.group(1).removeprefix("KVM_EXIT_"))
    elif event == "kvm_vcpu_wakeup":   # include/trace/events/kvm.h
        m = _WAKEUP.match(body)
        if m:
            return Wakeup(tid, ts_ns, int(m.group(2)), m.group(1) == "wait", m.group(3) == "valid")
    return None


def parse_line(line: str, vendor: Vendor | None = None) -> Line | None:
    """Parse one ftrace text line; None for headers and non-matching lines."""
    m = _LINE.match(line)
    if not m:
        return None
    task, tid, ts_ns = m.group("task"), int(m.group("tid")), ts_to_ns(m.group("ts"))
    event = m.group("event")
    ev = parse_body(event, m.group("body"), tid, ts_ns, vendor, task) if event in KVM_EVENTS else None
    return Line(task, tid, ts_ns, ev)


def detect_vendor(lines: Iterable[str]) -> Vendor | None:
    """Vendor from the first kvm_exit whose reason name belongs to one table only."""
    for line in lines:
        if "kvm_exit:" not in line:
            continue
        m = _LINE.match(line)
        if not m:
            continue
        body = m.group("body")
        mm = _EXIT_NEW.match(body) or _EXIT_OLD.match(body)
        if mm:
            vendor = vendor_of_reason_name(mm.group(mm.lastindex))
            if vendor:
                return vendor
    return None


def parse_lines(lines: Iterable[str], vendor: Vendor | None = None) -> Iterator[Line]:
    """Parsed lines that carry a kvm event, in input order."""
    for line in lines:
        parsed = parse_line(line, vendor)
        if parsed is not None and parsed.event is not None:
            yield parsed
