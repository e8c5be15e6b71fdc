"""`doctor`: what works on this host for each kvm-utils mode, and how to fix what does not."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tools.kvm_utils.record import host_vendor
from tools.kvm_utils.errors import NotAvailable
from tools.kvm_utils.sources.tracefs import (available_kvm_events, find_tracefs, stale_instances,
                                             tracefs_mounted)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    required: bool = True


def kprobes_available(tracefs: Path | None, kallsyms: Path = Path("/proc/kallsyms")) -> Check:
    """kprobe mode (vmx_handle_exit-level probes) needs CONFIG_KPROBE_EVENTS: kprobe_events in tracefs."""
    if tracefs is not None and (tracefs / "kprobe_events").exists():
        return Check("kprobes", True, f"{tracefs}/kprobe_events present", required=False)
    return Check("kprobes", False, "no kprobe_events in tracefs: kernel built without CONFIG_KPROBE_EVENTS; "
                 "kprobe mode is unavailable, tracepoint modes are unaffected", required=False)


def run_checks(explicit_tracefs: Path | None = None) -> list[Check]:
    checks = [Check("root", os.geteuid() == 0, "running as root" if os.geteuid() == 0 else
                    "tracefs, perf tracepoints and BPF need root: run with sudo")]
    kvm = Path("/dev/kvm").exists()
    checks.append(Check("/dev/kvm", kvm, "present" if kvm else "missing: modprobe kvm_intel or kvm_amd",
                        required=False))
    vendor = host_vendor()
    checks.append(Check("vendor", vendor is not None,
                        vendor or "no vmx/svm CPU flag (nested or software hypervisor such as PVM): "
                        "kvm_exit reasons cannot be named, kvm_exit may never fire", required=False))
    tracefs = explicit_tracefs or find_tracefs()
    if tracefs is None and os.geteuid() == 0:
        # Not mounted: check what the other commands will see once they mount it.
        try:
            with tracefs_mounted() as t:
                checks.append(Check("tracefs", True, f"not mounted; kvm-utils mounts it at {t} "
                                    "while it runs (checked)"))
                return checks + _tracefs_checks(t)
        except NotAvailable as e:
            checks.append(Check("tracefs", False, str(e)))
            return checks + _tracefs_checks(None)
    checks.append(Check("tracefs", tracefs is not None, str(tracefs) if tracefs else
                        "not mounted: mount -t tracefs nodev /sys/kernel/tracing (kvm-utils mounts it itself)"))
    return checks + _tracefs_checks(tracefs)


def _tracefs_checks(tracefs: Path | None) -> list[Check]:
    checks: list[Check] = []
    events = available_kvm_events(tracefs) if tracefs else []
    for ev in ("kvm_exit", "kvm_entry", "kvm_msr", "kvm_pio", "kvm_mmio", "kvm_fast_mmio", "kvm_userspace_exit"):
        checks.append(Check(f"kvm:{ev}", ev in events, "tracepoint present" if ev in events else
                            "missing: load kvm (modprobe kvm) on a kernel with CONFIG_KVM", required=ev == "kvm_exit"))
    if tracefs:
        stale = stale_instances(tracefs)
        checks.append(Check("stale instances", not stale, "none" if not stale else
                            f"left by killed kvm-utils runs: {' '.join(map(str, stale))} (rmdir them)",
                            required=False))
    paranoid = Path("/proc/sys/kernel/perf_event_paranoid")
    level = int(paranoid.read_text()) if paranoid.exists() else None
    checks.append(Check("perf_event_paranoid", os.geteuid() == 0 or (level is not None and level <= -1),
                        f"{level} (root bypasses it)" if os.geteuid() == 0 else
                        f"{level}: set to -1 or run as root for tracepoint counters"))
    bt = shutil.which("bpftrace")
    if bt:
        r = subprocess.run([bt, "-e", "BEGIN { exit(); }"], capture_output=True, text=True, timeout=60)
        ok = r.returncode == 0
        memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
        detail = "BPF programs load" if ok else f"bpftrace cannot load programs: {r.stderr.strip()[:200]}"
        if not ok and memlock != resource.RLIM_INFINITY:
            detail += f" (RLIMIT_MEMLOCK {memlock}: try ulimit -l unlimited)"
        checks.append(Check("bpftrace", ok, detail))
    else:
        checks.append(Check("bpftrace", False, "not installed: apt-get install bpftrace (latency/msr/io need it)"))
    checks.append(kprobes_available(tracefs))
    cc = shutil.which("cc") or shutil.which("gcc")
    checks.append(Check("C compiler", cc is not None, cc or "bench needs gcc: apt-get install gcc", required=False))
    return checks


def format_checks(checks: list[Check]) -> str:
    w = max(len(c.name) for c in checks)
    return "\n".join(f"{'ok  ' if c.ok else ('FAIL' if c.required else 'warn')}  {c.name:<{w}}  {c.detail}"
                     for c in checks)
