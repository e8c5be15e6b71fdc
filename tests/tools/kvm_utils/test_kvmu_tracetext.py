"""ftrace text parsing, one line at a time, in every format generation we accept."""

from __future__ import annotations

import pytest

from tools.kvm_utils.arch import Vendor
from tools.kvm_utils.events import Entry, Exit, Mmio, Msr, Pio, UserspaceExit
from tools.kvm_utils.sources.tracetext import (detect_vendor, parse_line, ts_to_ns,
                                               vcpu_of_task)

NEW_EXIT = ("       CPU 0/KVM-4101    [001] d..1.  1000.000100: kvm_exit: vcpu 0 reason MSR_WRITE "
            "rip 0xffffffff8107d4a4 info1 0x0000000000000000 info2 0x0000000000000000 "
            "intr_info 0x00000000 error_code 0x00000000")


def test_5_10_exit_with_task_name_containing_space_and_slash() -> None:
    line = parse_line(NEW_EXIT)
    assert line.task == "CPU 0/KVM"
    assert line.tid == 4101
    assert line.event == Exit(4101, 1000_000_100_000, "MSR_WRITE", 0, "CPU 0/KVM")


def test_4_19_exit_takes_vcpu_from_task_name() -> None:
    line = parse_line("       CPU 3/KVM-2301  [001] ....   500.000010: kvm_exit: reason IO_INSTRUCTION "
                      "rip 0xffffffff8104b5a6 info 6080048 0")
    assert line.event == Exit(2301, 500_000_010_000, "IO_INSTRUCTION", 3, "CPU 3/KVM")


def test_6_x_exit_with_requests_field_and_failed_vmentry_flag() -> None:
    line = parse_line("CPU 1/KVM-77 [000] 5.000000001: kvm_exit: vcpu 1 reason INVALID_STATE "
                      "FAILED_VMENTRY rip 0xfff0 info1 0x0000000000000000 info2 0x0000000000000000 "
                      "intr_info 0x00000000 error_code 0x00000000 requests 0x0000000000000000")
    assert line.event == Exit(77, 5_000_000_001, "INVALID_STATE FAILED_VMENTRY", 1, "CPU 1/KVM")


@pytest.mark.parametrize("vendor,expected", [
    (Vendor.INTEL, "UNKNOWN(0x4e)"),   # 78: no VMX reason
    (Vendor.AMD, "PF excp"),           # 0x40 + 14: SVM #PF intercept
    (None, "UNKNOWN(0x4e)"),           # vendor not known: never guess
])
def test_hex_reason_resolved_through_the_vendor_table(vendor, expected) -> None:
    """A kernel prints a code missing from its own table as hex; ours may still know it."""
    line = parse_line("CPU 0/KVM-9 [000] .... 1.000000: kvm_exit: reason 0x4e rip 0x0 info 0 0", vendor)
    assert line.event.reason == expected


def test_hex_reason_known_to_a_newer_table() -> None:
    line = parse_line("CPU 0/KVM-9 [000] .... 1.000000: kvm_exit: reason 0x4a rip 0x0 info 0 0", Vendor.INTEL)
    assert line.event.reason == "BUS_LOCK"


@pytest.mark.parametrize("body,expected", [
    ("vcpu 0", Entry(5, 1_000_000, 0)),
    ("vcpu 2, rip 0xffffffff81c0c6f4", Entry(5, 1_000_000, 2)),
    ("vcpu 1, rip 0xffffffff81035a3e intr_info 0x00000000 error_code 0x00000000", Entry(5, 1_000_000, 1)),
    ("msr_write 6e0 = 0x1d8e4b8f0c51a", Msr(5, 1_000_000, 0x6e0, True, 0x1d8e4b8f0c51a)),
    ("msr_read 1b = 0xfee00d00", Msr(5, 1_000_000, 0x1b, False, 0xfee00d00)),
    ("msr_write c0010200 = 0x530076 (#GP)", Msr(5, 1_000_000, 0xc0010200, True, 0x530076, True)),
    ("pio_read at 0x608 size 4 count 1 val 0xa3c41f ", Pio(5, 1_000_000, 0x608, False, 4, 1, 0xa3c41f)),
    ("pio_write at 0x3f8 size 1 count 3 val 0x41 (...)", Pio(5, 1_000_000, 0x3f8, True, 1, 3, 0x41)),
    ("mmio write len 4 gpa 0xfebf1000 val 0x1", Mmio(5, 1_000_000, 0xfebf1000, True, 4, 1)),
    ("mmio read len 8 gpa 0xfed000f0 val 0x1234", Mmio(5, 1_000_000, 0xfed000f0, False, 8, 0x1234)),
    ("mmio unsatisfied-read len 4 gpa 0xfebd1000 val 0x0",
     Mmio(5, 1_000_000, 0xfebd1000, False, 4, 0, unsatisfied=True)),
    ("fast mmio at gpa 0xfe003000", Mmio(5, 1_000_000, 0xfe003000, True, 0, 0, fast=True)),
    ("reason KVM_EXIT_IO (2)", UserspaceExit(5, 1_000_000, "IO")),
    ("reason restart (4)", UserspaceExit(5, 1_000_000, "restart")),
])
def test_event_bodies(body, expected) -> None:
    event = {Entry: "kvm_entry", Msr: "kvm_msr", Pio: "kvm_pio", Mmio: "kvm_mmio",
             UserspaceExit: "kvm_userspace_exit"}[type(expected)]
    if body.startswith("fast"):
        event = "kvm_fast_mmio"
    line = parse_line(f"  qemu-system-x86-5 [000] d..1.     0.001000: {event}: {body}")
    assert line.task == "qemu-system-x86"
    assert line.event == expected


@pytest.mark.parametrize("text", [
    "# tracer: nop",
    "#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION",
    "CPU:1 [LOST 12 EVENTS]",
    "cpus=2",
    "",
])
def test_headers_and_noise_are_skipped(text: str) -> None:
    assert parse_line(text) is None


def test_non_kvm_and_malformed_kvm_bodies_carry_no_event() -> None:
    assert parse_line("  <idle>-0 [000] d..2. 1.000000: sched_switch: prev_comm=swapper/0").event is None
    assert parse_line("  CPU 0/KVM-9 [000] d..2. 1.000000: kvm_exit: garbage here").event is None
    assert parse_line("  CPU 0/KVM-9 [000] d..2. 1.000000: kvm_apic_ipi: dst 1 vec 251").event is None


def test_record_tgid_column_and_no_flags_column() -> None:
    line = parse_line("  CPU 0/KVM-4101  (   4090) [001] d..1.  7.000002: kvm_entry: vcpu 0, rip 0x1")
    assert (line.tid, line.event) == (4101, Entry(4101, 7_000_002_000, 0))
    line = parse_line("CPU 0/KVM-4101 [001] 7.000002: kvm_entry: vcpu 0")
    assert line.event == Entry(4101, 7_000_002_000, 0)


def test_task_names_with_dashes_and_digits() -> None:
    line = parse_line("kworker/u4:2-events_unbound-88 [000] .... 1.000000: kvm_pio: pio_write at 0x80 "
                      "size 1 count 1 val 0x0 ")
    assert (line.task, line.tid) == ("kworker/u4:2-events_unbound", 88)


def test_ts_to_ns_is_exact_for_us_and_ns_resolution() -> None:
    assert ts_to_ns("10765.034835") == 10765_034_835_000
    assert ts_to_ns("3000.000101357") == 3000_000_101_357
    assert ts_to_ns("12") == 12_000_000_000
    # float parsing would give 0.1 + 0.2 style errors on large timestamps
    assert ts_to_ns("99999999.000001") == 99999999_000_001_000


def test_vcpu_of_task() -> None:
    assert vcpu_of_task("CPU 12/KVM") == 12
    assert vcpu_of_task("qemu-system-x86") is None
    assert vcpu_of_task("CPU 0/KVM-extra") is None


def test_detect_vendor() -> None:
    amd = "CPU 0/KVM-1 [000] .... 1.0: kvm_exit: vcpu 0 reason npf rip 0x0 info1 0x0 info2 0x0"
    unknown = "CPU 0/KVM-1 [000] .... 1.0: kvm_exit: reason 0x4e rip 0x0 info 0 0"
    assert detect_vendor([unknown, amd]) is Vendor.AMD
    assert detect_vendor([NEW_EXIT]) is Vendor.INTEL
    assert detect_vendor([unknown]) is None
