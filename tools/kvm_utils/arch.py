"""Exit-reason, userspace-exit and MSR name tables, keyed by numeric code.

The VMX and SVM tables follow the kernel's own `__print_symbolic` tables in
`arch/x86/include/uapi/asm/{vmx,svm}.h` (VMX_EXIT_REASONS / SVM_EXIT_REASONS), so a
name we print is the name `kvm:kvm_exit` prints in ftrace text. Lookups never raise:
an unknown code is `UNKNOWN(0xNN)`.
"""

from __future__ import annotations

from enum import Enum

VMX_FAILED_VMENTRY = 0x80000000


class Vendor(str, Enum):
    INTEL = "intel"   # VMX, kvm_exit isa == 1 (KVM_ISA_VMX)
    AMD = "amd"       # SVM, kvm_exit isa == 2 (KVM_ISA_SVM)


ISA_TO_VENDOR = {1: Vendor.INTEL, 2: Vendor.AMD}

VMX_EXIT_REASONS: dict[int, str] = {
    0: "EXCEPTION_NMI", 1: "EXTERNAL_INTERRUPT", 2: "TRIPLE_FAULT", 3: "INIT_SIGNAL",
    4: "SIPI_SIGNAL", 5: "IO_SMI", 6: "OTHER_SMI", 7: "INTERRUPT_WINDOW", 8: "NMI_WINDOW",
    9: "TASK_SWITCH", 10: "CPUID", 11: "GETSEC", 12: "HLT", 13: "INVD", 14: "INVLPG",
    15: "RDPMC", 16: "RDTSC", 17: "RSM", 18: "VMCALL", 19: "VMCLEAR", 20: "VMLAUNCH",
    21: "VMPTRLD", 22: "VMPTRST", 23: "VMREAD", 24: "VMRESUME", 25: "VMWRITE", 26: "VMOFF",
    27: "VMON", 28: "CR_ACCESS", 29: "DR_ACCESS", 30: "IO_INSTRUCTION", 31: "MSR_READ",
    32: "MSR_WRITE", 33: "INVALID_STATE", 34: "MSR_LOAD_FAIL", 36: "MWAIT_INSTRUCTION",
    37: "MONITOR_TRAP_FLAG", 39: "MONITOR_INSTRUCTION", 40: "PAUSE_INSTRUCTION",
    41: "MCE_DURING_VMENTRY", 43: "TPR_BELOW_THRESHOLD", 44: "APIC_ACCESS",
    45: "EOI_INDUCED", 46: "GDTR_IDTR", 47: "LDTR_TR", 48: "EPT_VIOLATION",
    49: "EPT_MISCONFIG", 50: "INVEPT", 51: "RDTSCP", 52: "PREEMPTION_TIMER", 53: "INVVPID",
    54: "WBINVD", 55: "XSETBV", 56: "APIC_WRITE", 57: "RDRAND", 58: "INVPCID", 59: "VMFUNC",
    60: "ENCLS", 61: "RDSEED", 62: "PML_FULL", 63: "XSAVES", 64: "XRSTORS", 67: "UMWAIT",
    68: "TPAUSE", 74: "BUS_LOCK", 75: "NOTIFY", 77: "TDCALL", 84: "MSR_READ_IMM",
    85: "MSR_WRITE_IMM",
}

_SVM_EXCP = {0: "DE", 1: "DB", 3: "BP", 4: "OF", 5: "BR", 6: "UD", 7: "NM", 8: "DF",
             10: "TS", 11: "NP", 12: "SS", 13: "GP", 14: "PF", 16: "MF", 17: "AC",
             18: "MC", 19: "XF"}

SVM_EXIT_REASONS: dict[int, str] = {
    **{n: f"read_cr{n}" for n in (0, 2, 3, 4, 8)},
    **{0x10 + n: f"write_cr{n}" for n in (0, 2, 3, 4, 8)},
    **{0x20 + n: f"read_dr{n}" for n in range(8)},
    **{0x30 + n: f"write_dr{n}" for n in range(8)},
    **{0x40 + n: f"{name} excp" for n, name in _SVM_EXCP.items()},
    0x060: "interrupt", 0x061: "nmi", 0x062: "smi", 0x063: "init", 0x064: "vintr",
    0x065: "cr0_sel_write", 0x066: "read_idtr", 0x067: "read_gdtr", 0x068: "read_ldtr",
    0x069: "read_rt", 0x06a: "write_idtr", 0x06b: "write_gdtr", 0x06c: "write_ldtr",
    0x06d: "write_rt", 0x06e: "rdtsc", 0x06f: "rdpmc", 0x070: "pushf", 0x071: "popf",
    0x072: "cpuid", 0x073: "rsm", 0x074: "iret", 0x075: "swint", 0x076: "invd",
    0x077: "pause", 0x078: "hlt", 0x079: "invlpg", 0x07a: "invlpga", 0x07b: "io",
    0x07c: "msr", 0x07d: "task_switch", 0x07e: "ferr_freeze", 0x07f: "shutdown",
    0x080: "vmrun", 0x081: "hypercall", 0x082: "vmload", 0x083: "vmsave", 0x084: "stgi",
    0x085: "clgi", 0x086: "skinit", 0x087: "rdtscp", 0x088: "icebp", 0x089: "wbinvd",
    0x08a: "monitor", 0x08b: "mwait", 0x08d: "xsetbv", 0x08f: "write_efer_trap",
    0x090: "write_cr0_trap", 0x094: "write_cr4_trap", 0x098: "write_cr8_trap",
    0x0a2: "invpcid", 0x0a5: "buslock", 0x0a6: "idle-halt", 0x400: "npf",
    0x401: "avic_incomplete_ipi", 0x402: "avic_unaccelerated_access", 0x403: "vmgexit",
    0x80000001: "vmgexit_mmio_read", 0x80000002: "vmgexit_mmio_write",
    0x80000003: "vmgexit_nmi_complete", 0x80000004: "vmgexit_ap_hlt_loop",
    0x80000005: "vmgexit_ap_jump_table", 0x80000010: "vmgexit_page_state_change",
    0x80000011: "vmgexit_guest_request", 0x80000012: "vmgexit_ext_guest_request",
    0x80000013: "vmgexit_ap_creation", 0x8000fffd: "vmgexit_hypervisor_feature",
    0xffffffff: "invalid_guest_state",
}

_NAME_TO_VENDOR: dict[str, Vendor] = {
    **{name: Vendor.INTEL for name in VMX_EXIT_REASONS.values()},
    **{name: Vendor.AMD for name in SVM_EXIT_REASONS.values()},
}

USERSPACE_EXIT_REASONS: dict[int, str] = {
    0: "UNKNOWN", 1: "EXCEPTION", 2: "IO", 3: "HYPERCALL", 4: "DEBUG", 5: "HLT", 6: "MMIO",
    7: "IRQ_WINDOW_OPEN", 8: "SHUTDOWN", 9: "FAIL_ENTRY", 10: "INTR", 11: "SET_TPR",
    12: "TPR_ACCESS", 13: "S390_SIEIC", 14: "S390_RESET", 15: "DCR", 16: "NMI",
    17: "INTERNAL_ERROR", 18: "OSI", 19: "PAPR_HCALL", 20: "S390_UCONTROL", 21: "WATCHDOG",
    22: "S390_TSCH", 23: "EPR", 24: "SYSTEM_EVENT", 25: "S390_STSI", 26: "IOAPIC_EOI",
    27: "HYPERV", 28: "ARM_NISV", 29: "X86_RDMSR", 30: "X86_WRMSR", 31: "DIRTY_RING_FULL",
    32: "AP_RESET_HOLD", 33: "X86_BUS_LOCK", 34: "XEN", 35: "RISCV_SBI", 36: "RISCV_CSR",
    37: "NOTIFY", 38: "LOONGARCH_IOCSR", 39: "MEMORY_FAULT", 40: "TDX",
}


def unknown(code: int) -> str:
    return f"UNKNOWN(0x{code:02x})"


def exit_reason_name(vendor: Vendor | None, code: int) -> str:
    """Name of a raw `kvm_exit.exit_reason` for `vendor`; `UNKNOWN(0xNN)` if not in the table.

    VMX keeps the basic reason in bits 15:0 and flags (FAILED_VMENTRY) above; SVM
    exit codes are used whole (VMGEXIT codes live at 0x8000_00xx).
    """
    code &= 0xffffffff
    if vendor is Vendor.INTEL:
        name = VMX_EXIT_REASONS.get(code & 0xffff, unknown(code & 0xffff))
        return f"{name} FAILED_VMENTRY" if code & VMX_FAILED_VMENTRY else name
    if vendor is Vendor.AMD:
        return SVM_EXIT_REASONS.get(code, unknown(code))
    return unknown(code)


def vendor_of_reason_name(name: str) -> Vendor | None:
    """Which table a printed reason name comes from (None for UNKNOWN/hex forms)."""
    return _NAME_TO_VENDOR.get(name.split(" ")[0])


def userspace_exit_name(code: int) -> str:
    return USERSPACE_EXIT_REASONS.get(code, unknown(code))


# ---------------------------------------------------------------------------- MSRs

_X2APIC = {
    0x802: "X2APIC_ID", 0x803: "X2APIC_VERSION", 0x808: "X2APIC_TPR", 0x80a: "X2APIC_PPR",
    0x80b: "X2APIC_EOI", 0x80d: "X2APIC_LDR", 0x80f: "X2APIC_SIVR", 0x828: "X2APIC_ESR",
    0x82f: "X2APIC_LVT_CMCI", 0x830: "X2APIC_ICR", 0x832: "X2APIC_LVT_TIMER",
    0x833: "X2APIC_LVT_THERMAL", 0x834: "X2APIC_LVT_PMI", 0x835: "X2APIC_LVT_LINT0",
    0x836: "X2APIC_LVT_LINT1", 0x837: "X2APIC_LVT_ERROR", 0x838: "X2APIC_TMICT",
    0x839: "X2APIC_TMCCT", 0x83e: "X2APIC_TDCR", 0x83f: "X2APIC_SELF_IPI",
    **{0x810 + i: f"X2APIC_ISR{i}" for i in range(8)},
    **{0x818 + i: f"X2APIC_TMR{i}" for i in range(8)},
    **{0x820 + i: f"X2APIC_IRR{i}" for i in range(8)},
}

MSR_NAMES: dict[int, str] = {
    0x10: "IA32_TSC", 0x11: "KVM_WALL_CLOCK", 0x12: "KVM_SYSTEM_TIME",
    0x1b: "IA32_APIC_BASE", 0x3a: "IA32_FEATURE_CONTROL", 0x3b: "IA32_TSC_ADJUST",
    0x48: "IA32_SPEC_CTRL", 0x49: "IA32_PRED_CMD", 0x79: "IA32_UCODE_WRITE",
    0x8b: "IA32_UCODE_REV", 0xe7: "IA32_MPERF", 0xe8: "IA32_APERF",
    0x10a: "IA32_ARCH_CAPABILITIES", 0x10b: "IA32_FLUSH_CMD",
    0x174: "IA32_SYSENTER_CS", 0x175: "IA32_SYSENTER_ESP", 0x176: "IA32_SYSENTER_EIP",
    0x179: "IA32_MCG_CAP", 0x17a: "IA32_MCG_STATUS",
    0x198: "IA32_PERF_STATUS", 0x199: "IA32_PERF_CTL", 0x19a: "IA32_CLOCK_MODULATION",
    0x1a0: "IA32_MISC_ENABLE", 0x1b0: "IA32_ENERGY_PERF_BIAS", 0x1d9: "IA32_DEBUGCTL",
    0x277: "IA32_PAT", 0x2ff: "IA32_MTRR_DEF_TYPE",
    **{0xc1 + i: f"IA32_PMC{i}" for i in range(8)},
    **{0x186 + i: f"IA32_PERFEVTSEL{i}" for i in range(8)},
    **{0x4c1 + i: f"IA32_A_PMC{i}" for i in range(8)},
    0x309: "IA32_FIXED_CTR0", 0x30a: "IA32_FIXED_CTR1", 0x30b: "IA32_FIXED_CTR2",
    0x345: "IA32_PERF_CAPABILITIES", 0x38d: "IA32_FIXED_CTR_CTRL",
    0x38e: "IA32_PERF_GLOBAL_STATUS", 0x38f: "IA32_PERF_GLOBAL_CTRL",
    0x390: "IA32_PERF_GLOBAL_OVF_CTRL", 0x3f1: "IA32_PEBS_ENABLE",
    0x6e0: "IA32_TSC_DEADLINE", 0xda0: "IA32_XSS", 0xe01: "IA32_PKRS",
    **_X2APIC,
    0xc0000080: "EFER", 0xc0000081: "STAR", 0xc0000082: "LSTAR", 0xc0000083: "CSTAR",
    0xc0000084: "SYSCALL_MASK", 0xc0000100: "FS_BASE", 0xc0000101: "GS_BASE",
    0xc0000102: "KERNEL_GS_BASE", 0xc0000103: "TSC_AUX",
    0xc0000300: "AMD64_PERF_CNTR_GLOBAL_STATUS", 0xc0000301: "AMD64_PERF_CNTR_GLOBAL_CTL",
    0xc0000302: "AMD64_PERF_CNTR_GLOBAL_STATUS_CLR",
    **{0xc0010000 + i: f"AMD_K7_EVNTSEL{i}" for i in range(4)},
    **{0xc0010004 + i: f"AMD_K7_PERFCTR{i}" for i in range(4)},
    **{0xc0010200 + 2 * i: f"AMD_F15H_PERF_CTL{i}" for i in range(6)},
    **{0xc0010201 + 2 * i: f"AMD_F15H_PERF_CTR{i}" for i in range(6)},
    0xc0010015: "AMD_HWCR", 0xc0010117: "AMD_VM_HSAVE_PA", 0xc0011029: "AMD_DE_CFG",
    0x4b564d00: "KVM_WALL_CLOCK_NEW", 0x4b564d01: "KVM_SYSTEM_TIME_NEW",
    0x4b564d02: "KVM_ASYNC_PF_EN", 0x4b564d03: "KVM_STEAL_TIME", 0x4b564d04: "KVM_PV_EOI_EN",
    0x4b564d05: "KVM_POLL_CONTROL", 0x4b564d06: "KVM_ASYNC_PF_INT",
    0x4b564d07: "KVM_ASYNC_PF_ACK", 0x4b564d08: "KVM_MIGRATION_CONTROL",
    0x40000000: "HV_GUEST_OS_ID", 0x40000001: "HV_HYPERCALL", 0x40000002: "HV_VP_INDEX",
    0x40000020: "HV_TIME_REF_COUNT", 0x40000021: "HV_REFERENCE_TSC",
}

_PMU_MARKS = ("PMC", "PERFEVTSEL", "FIXED_CTR", "PERF_GLOBAL", "EVNTSEL", "PERFCTR",
              "F15H_PERF", "PERF_CNTR", "PEBS", "PERF_CAPABILITIES")

#: vPMU MSRs: periodic exits on these mean a guest samples counters (perf, atop IPC).
PMU_MSRS = frozenset(c for c, n in MSR_NAMES.items() if any(m in n for m in _PMU_MARKS))


def msr_name(ecx: int) -> str:
    return MSR_NAMES.get(ecx, unknown(ecx))
