"""`doctor`: what works on this host for each kvm-utils mode, and how to fix what does not."""

from __future__ import annotations

import gzip
import os
import platform
import resource
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tools.kvm_utils import bpfload, kprobe_table, symbols
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
    """kprobe_events in tracefs (CONFIG_KPROBE_EVENTS): bpftrace attaches kprobes through perf's
    kprobe PMU, which needs CONFIG_KPROBES; the events file is the tracefs face of the same."""
    if tracefs is not None and (tracefs / "kprobe_events").exists():
        return Check("kprobes", True, f"{tracefs}/kprobe_events present", required=False)
    return Check("kprobes", False, "no kprobe_events in tracefs: kernel built without CONFIG_KPROBE_EVENTS; "
                 "the kprobe engine cannot use kprobes here (see `kprobe engine` below); "
                 "tracepoint modes are unaffected", required=False)


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
    checks.extend(kprobe_engine_facts(tracefs))
    cc = shutil.which("cc") or shutil.which("gcc")
    checks.append(Check("C compiler", cc is not None, cc or "bench needs gcc: apt-get install gcc", required=False))
    return checks


def kernel_config(option: str, release: str, proc: Path = Path("/proc"),
                  boot: Path = Path("/boot")) -> tuple[str | None, str]:
    """An option's value ('y', 'm', 'n' for "is not set") and the file that answered; (None, why) when
    neither /proc/config.gz nor /boot/config-RELEASE could be read."""
    for path in (proc / "config.gz", boot / f"config-{release}"):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8", "replace")
        for line in text.splitlines():
            if line.startswith(f"{option}="):
                return line.split("=", 1)[1], str(path)
            if line == f"# {option} is not set":
                return "n", str(path)
        return "n", f"{path} (not mentioned)"
    return None, f"neither {proc / 'config.gz'} nor {boot / f'config-{release}'} is readable"


def _kprobes_config(tracefs: Path | None, release: str) -> Check:
    value, source = kernel_config("CONFIG_KPROBES", release)
    if value is not None:
        return Check("CONFIG_KPROBES", value == "y", f"{value} (from {source})", required=False)
    has = tracefs is not None and (tracefs / "kprobe_events").exists()
    return Check("CONFIG_KPROBES", has, f"{'y' if has else 'n or unknown'} (from tracefs kprobe_events "
                 f"{'present' if has else 'absent'}; {source})", required=False)


def kprobe_engine_facts(tracefs: Path | None, release: str | None = None) -> list[Check]:
    """The facts the kprobe engine (sources/kprobe.py) stands on, as found here, ending with the
    verdict `kprobe engine`: which attach mechanism it will use, or exactly why none; all
    informational (tracepoint modes do not need any of it)."""
    release = release or platform.release()
    checks = [Check("kernel", True, release, required=False), _kprobes_config(tracefs, release)]
    tp = bpfload.tracepoint_program_loads()
    checks.append(Check("BPF tracepoint program", tp.ok, tp.detail + " (raw bpf() PROG_LOAD)", required=False))
    try:
        vmlinux, modules, why = symbols.read_btf()
    except (OSError, symbols.BtfError) as e:
        vmlinux, modules, why = None, {}, str(e)
    if vmlinux is None:
        checks.append(Check("BTF", False, why, required=False))
        checks.append(Check("BPF fentry program", False, "not tried: no vmlinux BTF", required=False))
    else:
        mods = f"; module BTF: {' '.join(modules)}" if modules else "; no KVM module BTF (KVM built in?)"
        checks.append(Check("BTF", True, f"vmlinux: {len(vmlinux.funcs)} functions{mods}", required=False))
        fe_ok, fe_detail = _fentry_loads(vmlinux)
        checks.append(Check("BPF fentry program", fe_ok, fe_detail, required=False))
    checks.extend(_symbol_checks(tracefs, release, vmlinux, modules))
    support = kprobe_engine_support(tracefs, release, vmlinux)
    checks.append(Check("kprobe engine", support.kind is not None,
                        (f"uses {support.kind}: " if support.kind else "unavailable: ") + support.why, required=False))
    return checks


def _fentry_loads(vmlinux: symbols.Btf) -> tuple[bool, str]:
    fn = next((f for f in ("kvm_vcpu_halt", "kvm_vcpu_block", "schedule") if f in vmlinux.funcs), None)
    if fn is None:
        return False, "not tried: no known function in BTF"
    fe = bpfload.fentry_program_loads(vmlinux.funcs[fn])
    return fe.ok, f"{fe.detail} (raw bpf() PROG_LOAD on fentry:{fn})"


@dataclass(frozen=True)
class KprobeSupport:
    kind: str | None     # "fentry", "kprobe", or None: the engine cannot attach here
    why: str


def kprobe_engine_support(tracefs: Path | None, release: str | None = None,
                          vmlinux: symbols.Btf | None = None) -> KprobeSupport:
    """Which attach mechanism the kprobe engine uses here (fentry when the kernel loads fentry
    programs: no breakpoint per call; else kprobes when CONFIG_KPROBES=y), or why neither.
    The one place that decides it: doctor's verdict, the engine's start and the live test's skip."""
    release = release or platform.release()
    if vmlinux is None:
        try:
            vmlinux, _, why = symbols.read_btf()
        except (OSError, symbols.BtfError) as e:
            vmlinux, why = None, str(e)
    if vmlinux is None:
        fe_ok, fe_detail = False, f"not possible without vmlinux BTF ({why})"
    else:
        fe_ok, fe_detail = _fentry_loads(vmlinux)
    value, source = kernel_config("CONFIG_KPROBES", release)
    if value is None:
        has = tracefs is not None and (tracefs / "kprobe_events").exists()
        value, source = ("y" if has else None), f"tracefs kprobe_events {'present' if has else 'absent'}; {source}"
    if fe_ok:
        return KprobeSupport("fentry", f"BPF fentry programs load ({fe_detail})")
    if value == "y":
        return KprobeSupport("kprobe", f"CONFIG_KPROBES=y ({source}); fentry not used: {fe_detail}")
    kp = ("CONFIG_KPROBES is not set" if value == "n" else "CONFIG_KPROBES unknown and no kprobe_events") \
        + f" ({source}): no kprobe/kretprobe can attach"
    return KprobeSupport(None, f"{kp}; BPF fentry refused: {fe_detail}: no fentry/fexit either. "
                               "Tracepoint modes are unaffected")


def _symbol_checks(tracefs: Path | None, release: str, vmlinux: symbols.Btf | None,
                   modules: dict[str, symbols.Btf]) -> list[Check]:
    reports = [symbols.kallsyms_report(), symbols.filter_functions_report(tracefs)]
    checks = [Check(r.source, r.names is not None,
                    f"{len(r.names)} functions" if r.names is not None else r.why, required=False)
              for r in reports]
    available: set[str] = set(reports[0].names or ())
    for b in [vmlinux, *modules.values()]:
        available |= set(b.funcs) if b else set()
    vendor = kprobe_table.engine_vendor(host_vendor(), frozenset(available))
    if vendor is None:
        return checks + [Check("kprobe symbols", False, "no vmx/svm CPU flag and no pvm_handle_exit: "
                               "no KVM vendor to resolve symbols for", required=False)]
    res = kprobe_table.resolve(kprobe_table.parse_version(release), vendor, frozenset(available))
    ok = [f"{p.probe.purpose}:{p.symbol}" for p in res.probes if p.symbol]
    checks.append(Check("kprobe symbols", not res.missing(),
                        f"{vendor}, kernel {res.kernel[0]}.{res.kernel[1]} (kallsyms + BTF): purposes the "
                        f"kprobe engine could serve: {', '.join(res.servable()) or 'none'}; "
                        f"found {' '.join(ok)}", required=False))
    checks.extend(Check("kprobe symbol", False, p.message, required=False) for p in res.missing())
    from tools.kvm_utils.sources.kprobe import view_coverage
    waking = tracefs is not None and (tracefs / "events/sched/sched_waking").is_dir()
    checks.extend(Check(f"kprobe view {view}", ok, detail, required=False)
                  for view, ok, detail in view_coverage(res, waking))
    return checks


def format_checks(checks: list[Check]) -> str:
    w = max(len(c.name) for c in checks)
    return "\n".join(f"{'ok  ' if c.ok else ('FAIL' if c.required else 'warn')}  {c.name:<{w}}  {c.detail}"
                     for c in checks)
