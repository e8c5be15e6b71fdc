"""Exit-reason and MSR tables against codes from the Intel SDM (Vol. 3 App. C), AMD APM
(Vol. 2 App. C) and the kernel's VMX_EXIT_REASONS / SVM_EXIT_REASONS print tables."""

from __future__ import annotations

import pytest

from tools.kvm_utils.arch import (PMU_MSRS, Vendor, exit_reason_name, msr_name,
                                  userspace_exit_name, vendor_of_reason_name)


@pytest.mark.parametrize("code,name", [
    (0, "EXCEPTION_NMI"), (1, "EXTERNAL_INTERRUPT"), (10, "CPUID"), (12, "HLT"),
    (18, "VMCALL"), (30, "IO_INSTRUCTION"), (31, "MSR_READ"), (32, "MSR_WRITE"),
    (40, "PAUSE_INSTRUCTION"), (48, "EPT_VIOLATION"), (49, "EPT_MISCONFIG"),
    (52, "PREEMPTION_TIMER"), (74, "BUS_LOCK"), (75, "NOTIFY"),
])
def test_vmx_known_codes(code: int, name: str) -> None:
    assert exit_reason_name(Vendor.INTEL, code) == name


def test_vmx_uses_low_16_bits_and_names_failed_vmentry() -> None:
    assert exit_reason_name(Vendor.INTEL, 0x80000021) == "INVALID_STATE FAILED_VMENTRY"
    assert exit_reason_name(Vendor.INTEL, 0x0001_0030) == "EPT_VIOLATION"   # bits above 15 ignored


@pytest.mark.parametrize("code,name", [
    (0x060, "interrupt"), (0x072, "cpuid"), (0x078, "hlt"), (0x07b, "io"), (0x07c, "msr"),
    (0x081, "hypercall"), (0x400, "npf"), (0x04e, "PF excp"), (0x013, "write_cr3"),
    (0x80000002, "vmgexit_mmio_write"), (0xffffffff, "invalid_guest_state"),
])
def test_svm_known_codes(code: int, name: str) -> None:
    assert exit_reason_name(Vendor.AMD, code) == name


@pytest.mark.parametrize("vendor,code,name", [
    (Vendor.INTEL, 0x4e, "UNKNOWN(0x4e)"), (Vendor.INTEL, 35, "UNKNOWN(0x23)"),
    (Vendor.INTEL, 5000, "UNKNOWN(0x1388)"), (Vendor.AMD, 0x4ff, "UNKNOWN(0x4ff)"),
    (Vendor.AMD, 0x9, "UNKNOWN(0x09)"), (None, 12, "UNKNOWN(0x0c)"),
    (Vendor.AMD, -2, "UNKNOWN(0xfffffffe)"),
])
def test_unknown_codes_never_raise(vendor, code, name) -> None:
    assert exit_reason_name(vendor, code) == name


def test_vendor_of_reason_name() -> None:
    assert vendor_of_reason_name("EPT_VIOLATION") is Vendor.INTEL
    assert vendor_of_reason_name("INVALID_STATE FAILED_VMENTRY") is Vendor.INTEL
    assert vendor_of_reason_name("npf") is Vendor.AMD
    assert vendor_of_reason_name("0x4e") is None


@pytest.mark.parametrize("ecx,name", [
    (0x6e0, "IA32_TSC_DEADLINE"), (0x830, "X2APIC_ICR"), (0x80b, "X2APIC_EOI"),
    (0x1b, "IA32_APIC_BASE"), (0x10, "IA32_TSC"), (0x38f, "IA32_PERF_GLOBAL_CTRL"),
    (0x4b564d01, "KVM_SYSTEM_TIME_NEW"), (0x4b564d02, "KVM_ASYNC_PF_EN"),
    (0xc0000080, "EFER"), (0x12345, "UNKNOWN(0x12345)"),
])
def test_msr_names(ecx: int, name: str) -> None:
    assert msr_name(ecx) == name


def test_pmu_msr_set() -> None:
    for ecx in (0xc1, 0x186, 0x309, 0x38d, 0x38f, 0xc0010200, 0xc0010004):
        assert ecx in PMU_MSRS, hex(ecx)
    for ecx in (0x199, 0x198, 0x6e0, 0x830, 0x10):   # P-state / timer / TSC are not vPMU
        assert ecx not in PMU_MSRS, hex(ecx)


def test_userspace_exit_names() -> None:
    assert userspace_exit_name(2) == "IO"
    assert userspace_exit_name(5) == "HLT"
    assert userspace_exit_name(6) == "MMIO"
    assert userspace_exit_name(999) == "UNKNOWN(0x3e7)"
