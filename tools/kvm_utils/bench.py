"""`bench`: exit-path microbenchmarks through /dev/kvm with a tiny real-mode guest.

The C helper (helper/kvm_exit_bench.c) is compiled on first use into a cache directory
keyed by the source hash. Each test runs one instruction in a loop, doubling the
iteration count until a run takes at least `target_cycles` TSC cycles (as kvm-unit-tests
x86/vmexit.c does); the loop overhead measured by the `nop` test is subtracted.

The LAPIC cases (ipi, ipi_halt, tscdeadline, tscdeadline_immed: kvm-unit-tests x86/vmexit.c's)
also report the guest's own time per operation, median and p99 of the fastest run: an IPI or
a timer interrupt is a round trip through the in-kernel LAPIC, not one instruction, so a
mean over a loop hides the preemptions that p99 shows. They have no nop-loop subtraction
(their loop is not the nop loop's). A case the host's KVM cannot run fails alone, with the
helper's reason (the capability or ioctl it lacks), and the others are still measured.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tools.kvm_utils.errors import KvmUtilsError, NotAvailable

log = logging.getLogger(__name__)

HELPER_SRC = Path(__file__).parent / "helper" / "kvm_exit_bench.c"
GUEST_SRC = Path(__file__).parent / "helper" / "kvm_guest_bench.c"
GUEST_TESTS = ("rdtsc", "cpuid", "clock_gettime", "pio_in", "mmio_read")

#: test name -> (helper mode, what the exit goes through)
TESTS: dict[str, tuple[str, str]] = {
    "pio_out_user": ("pio_out", "OUT to port 0x10, completed by userspace (KVM_EXIT_IO)"),
    "pio_in_user": ("pio_in", "IN from port 0x10, completed by userspace (KVM_EXIT_IO)"),
    "pio_in_kernel": ("pio_kernel", "IN from port 0x21 (PIC), in-kernel irqchip"),
    "mmio_write_user": ("mmio_write", "byte write to unmapped GPA 0x20000 (KVM_EXIT_MMIO)"),
    "mmio_read_user": ("mmio_read", "byte read from unmapped GPA 0x20000 (KVM_EXIT_MMIO)"),
    "cpuid": ("cpuid", "CPUID leaf 0, in kernel"),
    "hlt_user": ("hlt", "HLT without in-kernel irqchip: exit to userspace and resume"),
    "rdmsr_tsc": ("rdmsr", "RDMSR IA32_TSC (0x10), in kernel"),
    "wrmsr_tsc_deadline": ("wrmsr", "WRMSR IA32_TSC_DEADLINE (0x6e0) = 0, in-kernel LAPIC"),
    "ipi": ("ipi", "x2APIC ICR write (MSR 0x830) to running vCPU 1, until its handler ran"),
    "ipi_halt": ("ipi_halt", "x2APIC ICR write (MSR 0x830) to vCPU 1 in HLT, until its handler ran"),
    "tscdeadline": ("tscdeadline", "arm IA32_TSC_DEADLINE (0x6e0) now+3000 cycles, LVTT TSC-deadline mode, until the interrupt"),
    "tscdeadline_immed": ("tscdeadline_immed", "arm IA32_TSC_DEADLINE (0x6e0) already past, until the interrupt"),
}
#: helper modes that time each operation in the guest (op_cycles_p50/p99 in their result)
LAPIC_MODES = frozenset({"ipi", "ipi_halt", "tscdeadline", "tscdeadline_immed"})


def hypervisor(sys_module: Path = Path("/sys/module")) -> str | None:
    """Which KVM vendor module serves /dev/kvm, for error messages ("PVM: ... lacks ...")."""
    for mod, name in (("kvm_pvm", "PVM"), ("kvm_intel", "VMX"), ("kvm_amd", "SVM")):
        if (sys_module / mod).exists():
            return name
    return None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvm-utils"


def _compile(src: Path, exe: Path, extra: list[str]) -> Path:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise NotAvailable("building the bench helpers needs a C compiler: apt-get install gcc")
    exe.parent.mkdir(parents=True, exist_ok=True)
    tmp = exe.with_name(f".{exe.name}.tmp{os.getpid()}")
    r = subprocess.run([cc, "-O2", "-Wall", *extra, "-o", str(tmp), str(src)], capture_output=True, text=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        hint = " (static linking needs libc6-dev's libc.a)" if "-static" in extra else ""
        raise KvmUtilsError(f"compiling {src} failed{hint}:\n{r.stderr}")
    tmp.rename(exe)
    log.info("event=helper_built path=%s", exe)
    return exe


def guest_bench_path(output: Path | None = None) -> Path:
    """The static in-guest benchmark (built with `cc -static` when missing or to `output`)."""
    digest = hashlib.sha256(GUEST_SRC.read_bytes()).hexdigest()[:12]
    cached = cache_dir() / f"kvm-guest-bench-{digest}"
    if not cached.exists():
        _compile(GUEST_SRC, cached, ["-static"])
    if output is None:
        return cached
    shutil.copy2(cached, output)
    return output


def run_guest_bench(exe: Path, tests: list[str] | None, target_cycles: int, repeat: int) -> dict[str, Any]:
    """Run the in-guest benchmark here (inside a VM, or as a smoke check on a host)."""
    argv = [str(exe), "--target-cycles", str(target_cycles), "--repeat", str(repeat)]
    if tests:
        bad = [t for t in tests if t not in GUEST_TESTS]
        if bad:
            raise KvmUtilsError(f"--tests: unknown {','.join(bad)} for --guest (known: {','.join(GUEST_TESTS)})")
        argv += ["--tests", ",".join(tests)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        raise KvmUtilsError(f"{exe}: exit {r.returncode}, no result ({r.stderr.strip()})") from None


def format_guest(d: dict[str, Any]) -> str:
    lines = [f"in VM: {d['in_vm']} ({d['hypervisor'] or '-'}), clocksource {d['clocksource'] or '?'}, "
             f"TSC ~{d['tsc_khz'] / 1e6:.3f} GHz, port {d['port']}, MMIO {d['mmio_gpa']}",
             f"{'test':<16} {'iterations':>10} {'cycles/iter':>12} {'ns/iter':>10}"]
    for r in d["results"]:
        if "error" in r:
            lines.append(f"{r['name']:<16} error: {r['error']}")
        else:
            lines.append(f"{r['name']:<16} {r['iterations']:>10} {r['cycles_per_iter']:>12.1f} {r['ns_per_iter']:>10.1f}")
    return "\n".join(lines)


def helper_path(build: bool = True) -> Path:
    """The compiled helper ($KVM_UTILS_HELPER overrides); built with `cc` when missing."""
    env = os.environ.get("KVM_UTILS_HELPER")
    if env:
        return Path(env)
    digest = hashlib.sha256(HELPER_SRC.read_bytes()).hexdigest()[:12]
    exe = cache_dir() / f"kvm-exit-bench-{digest}"
    if exe.exists() or not build:
        return exe
    return _compile(HELPER_SRC, exe, [])


def helper_argv(mode: str, iterations: int, *, name: str | None = None, target_cycles: int | None = None,
                linger_ms: int = 0, delay_ms: int = 0, port: int | None = None, vector: int | None = None,
                wait_stdin: bool = False, repeat: bool = False) -> list[str]:
    argv = [str(helper_path())]
    if name:
        argv += ["-name", f"guest={name}"]
    if target_cycles:
        argv += ["--target-cycles", str(target_cycles)]
    if linger_ms:
        argv += ["--linger-ms", str(linger_ms)]
    if delay_ms:
        argv += ["--delay-ms", str(delay_ms)]
    if port is not None:
        argv += ["--port", hex(port)]
    if vector is not None:
        argv += ["--vector", hex(vector)]
    if wait_stdin:
        argv += ["--wait-stdin"]
    if repeat:
        argv += ["--repeat"]
    return argv + [mode, str(iterations)]


def run_helper(mode: str, iterations: int, **kw: Any) -> dict[str, Any]:
    """Run the helper once; its JSON line as a dict (raises with the helper's own error)."""
    if not Path("/dev/kvm").exists():
        raise NotAvailable("/dev/kvm is missing: load kvm_intel/kvm_amd (or run on a KVM-capable host)")
    r = subprocess.run(helper_argv(mode, iterations, **kw), capture_output=True, text=True, timeout=600)
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise KvmUtilsError(f"bench helper {mode}: exit {r.returncode}, no result ({r.stderr.strip()})") from None
    if "error" in out:
        raise KvmUtilsError(f"bench helper {mode}: {out['error']}")
    return out


@dataclass(frozen=True)
class BenchResult:
    name: str
    mode: str
    what: str
    iterations: int = 0
    cycles_per_iter: float | None = None
    ns_per_iter: float | None = None
    net_cycles_per_iter: float | None = None   # minus the nop loop
    net_ns_per_iter: float | None = None
    userspace_exits_per_iter: float | None = None
    error: str | None = None
    # LAPIC cases: the guest's RDTSC around each operation, nearest rank over the run's last 16384
    op_samples: int | None = None
    median_cycles: int | None = None
    p99_cycles: int | None = None
    median_ns: float | None = None
    p99_ns: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def per_iter(out: dict[str, Any]) -> tuple[float, float]:
    n = out["iterations"]
    return out["tsc_cycles"] / n, out["ns"] / n


def best_of(mode: str, target_cycles: int, repeat: int) -> dict[str, Any]:
    """Fewest cycles per iteration over `repeat` runs: the least-disturbed run wins."""
    runs = [run_helper(mode, 1024, target_cycles=target_cycles) for _ in range(max(1, repeat))]
    return min(runs, key=lambda o: per_iter(o)[0])


def run_all(tests: list[str] | None, target_cycles: int = 1 << 30, repeat: int = 3) -> list[BenchResult]:
    names = tests or list(TESTS)
    unknown = [t for t in names if t not in TESTS]
    if unknown:
        raise KvmUtilsError(f"--tests: unknown {','.join(unknown)} (known: {','.join(TESTS)})")
    base = best_of("nop", target_cycles, repeat)
    base_c, base_ns = per_iter(base)
    results = [BenchResult("nop_loop", "nop", "loop overhead (dec/jnz), subtracted below", base["iterations"],
                           round(base_c, 1), round(base_ns, 1), 0.0, 0.0, 0.0)]
    for name in names:
        mode, what = TESTS[name]
        try:
            out = best_of(mode, target_cycles, repeat)
        except KvmUtilsError as e:
            hv = hypervisor() if mode in LAPIC_MODES else None
            results.append(BenchResult(name, mode, what, error=f"{hv}: {e}" if hv else str(e)))
            continue
        c, ns = per_iter(out)
        user = round(sum(out["userspace_exits"].values()) / out["iterations"], 3)
        if mode in LAPIC_MODES:
            results.append(lapic_result(name, mode, what, out, c, ns, user))
            continue
        results.append(BenchResult(name, mode, what, out["iterations"], round(c, 1), round(ns, 1),
                                   round(c - base_c, 1), round(ns - base_ns, 1), user))
    return results


def lapic_result(name: str, mode: str, what: str, out: dict[str, Any], c: float, ns: float,
                 user: float) -> BenchResult:
    """A LAPIC case: the host's mean per iteration plus the guest's per-operation percentiles
    (cycles of the guest TSC, converted with the vCPU's TSC rate)."""
    khz = out["tsc_khz"]
    to_ns = (lambda cyc: round(cyc * 1e6 / khz, 1)) if khz and khz > 0 else (lambda cyc: None)
    return BenchResult(name, mode, what, out["iterations"], round(c, 1), round(ns, 1), None, None, user,
                       op_samples=out["op_samples"], median_cycles=out["op_cycles_p50"],
                       p99_cycles=out["op_cycles_p99"], median_ns=to_ns(out["op_cycles_p50"]),
                       p99_ns=to_ns(out["op_cycles_p99"]))


def _num(v: float | int | None, width: int, fmt: str = ".1f") -> str:
    return f"{'-':>{width}}" if v is None else f"{v:>{width}{fmt}}"


def format_table(results: list[BenchResult]) -> str:
    """One row per test; the per-operation median/p99 columns appear when a LAPIC case ran."""
    ops = any(r.median_cycles is not None for r in results)
    head = f"{'test':<20} {'iterations':>10} {'cycles/iter':>12} {'ns/iter':>10} {'net cycles':>11} {'net ns':>9} {'user exits/iter':>15}"
    if ops:
        head += f" {'op cyc p50':>11} {'op cyc p99':>11} {'op ns p50':>10} {'op ns p99':>10}"
    lines = [head]
    for r in results:
        if r.error:
            lines.append(f"{r.name:<20} error: {r.error}")
            continue
        row = (f"{r.name:<20} {r.iterations:>10} {r.cycles_per_iter:>12.1f} {r.ns_per_iter:>10.1f} "
               f"{_num(r.net_cycles_per_iter, 11)} {_num(r.net_ns_per_iter, 9)} {r.userspace_exits_per_iter:>15.3f}")
        if ops:
            row += (f" {_num(r.median_cycles, 11, 'd')} {_num(r.p99_cycles, 11, 'd')}"
                    f" {_num(r.median_ns, 10)} {_num(r.p99_ns, 10)}")
        lines.append(row)
    return "\n".join(lines)
