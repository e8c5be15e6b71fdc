"""`diagnose`: collect evidence (a file, or live with bpftrace / an ftrace instance), apply
the rules, render the advice (`table` or `json`)."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

from tools.kvm_utils import procs
from tools.kvm_utils.aggregate import ThreadInfo
from tools.kvm_utils.arch import Vendor
from tools.kvm_utils.diagnose.evidence import Evidence, from_bpf_maps, from_events
from tools.kvm_utils.diagnose.rules import Diagnosis
from tools.kvm_utils.errors import KvmUtilsError
from tools.kvm_utils.sources import bpf, bpfwindow, recordfile
from tools.kvm_utils.sources.bpftrace_output import int_maps
from tools.kvm_utils.sources.tracetext import detect_vendor, parse_lines, vcpu_of_task
from tools.kvm_utils.stopping import block_in_this_thread


#: in-kernel aggregation keyed by (pid, tid, ...): one map update per event, nothing per
#: event in userspace. @ept[tid]: 1 = an EPT violation / NPF exit is open, 2 = it did MMIO.
SCRIPT = bpfwindow.begin() + """
tracepoint:kvm:kvm_exit {
  @x[pid, tid, (uint64)args->isa, (uint64)args->exit_reason] = count();
  if ((args->isa == 1 && args->exit_reason == 48) || (args->isa == 2 && args->exit_reason == 0x400)) {
    @ept[tid] = 1;
  }
}
tracepoint:kvm:kvm_entry /@ept[tid]/ { if (@ept[tid] == 1) { @f[pid, tid] = count(); } delete(@ept[tid]); }
tracepoint:kvm:kvm_mmio /@ept[tid]/ { @ept[tid] = 2; }
tracepoint:kvm:kvm_fast_mmio /@ept[tid]/ { @ept[tid] = 2; }
tracepoint:kvm:kvm_mmio /args->type != 0/ { @mm[pid, tid, args->gpa, (uint64)(args->type == 2)] = count(); }
tracepoint:kvm:kvm_fast_mmio { @mm[pid, tid, args->gpa, (uint64)1] = count(); }
tracepoint:kvm:kvm_msr { @m[pid, tid, (uint64)args->ecx, (uint64)args->write] = count(); }
tracepoint:kvm:kvm_msr /args->ecx == 0x830 && args->write/ { @icr[pid, tid, args->data & 0xff] = count(); }
tracepoint:kvm:kvm_pio { @p[pid, tid, (uint64)args->port, (uint64)args->rw] = count(); }
tracepoint:kvm:kvm_userspace_exit { @u[pid, tid, (uint64)args->reason] = count(); }
tracepoint:kvm:kvm_vcpu_wakeup { @w[pid, tid] = count(); }
"""
# the window ends when the interval fires (or, on Ctrl-C, at END: detaching takes a while)
_STAMP = f'printf("kvm-utils-elapsed-ns %lld\\n", nsecs - {bpfwindow.T0});'
_END = "END { " + _STAMP + f" {bpfwindow.CLEAR} clear(@ept); }}\n"
_ELAPSED = re.compile(r"kvm-utils-elapsed-ns (\d+)")


def bpf_script(duration: float | None) -> str:
    return SCRIPT + "".join(p + "\n" for p in bpfwindow.stop(duration, _STAMP)) + _END


# ------------------------------------------------------------------------ from a file

def evidence_from_lines(lines: Iterable[str], name: str = "-") -> Evidence:
    """A kvm-utils record file or ftrace text -> Evidence. The window is the record's
    duration when the header has one, else first to last kvm event timestamp."""
    header, body = recordfile.split(lines)
    body_lines = list(body)
    threads: dict[int, ThreadInfo] = dict(header.threads) if header else {}
    vendor = Vendor(header.vendor) if header and header.vendor else detect_vendor(body_lines)
    parsed = list(parse_lines(body_lines, vendor))
    for ln in parsed:
        threads.setdefault(ln.tid, ThreadInfo(vcpu_of_task(ln.task), None))
    if header is not None and header.duration_s:
        duration = float(header.duration_s)
        source = f"record {name}"
    else:
        source = f"ftrace text {name}"
        duration = (parsed[-1].ts_ns - parsed[0].ts_ns) / 1e9 if len(parsed) > 1 else 0.0
    ev = from_events((ln.event for ln in parsed), duration, threads, source)
    ev.lost_events = header.lost_events if header is not None else 0
    return ev


def evidence_from_file(path: Path) -> Evidence:
    if not path.is_file():
        raise KvmUtilsError(f"--input {path}: no such file")
    with open(path, encoding="utf-8", errors="replace") as f:
        return evidence_from_lines(f, path.name)


# ------------------------------------------------------------------------ live

def _threads_now(proc: Path) -> dict[int, ThreadInfo]:
    return procs.thread_map(procs.vm_processes(proc))


class _ThreadNamer:
    """Names vCPU threads from /proc once a second while tracing runs, so VMs that start and
    stop inside the window are still named (bpftrace only reports pid/tid at the end)."""

    def __init__(self, proc: Path, every: float = 1.0) -> None:
        self.proc, self.every = proc, every
        self.threads: dict[int, ThreadInfo] = _threads_now(proc)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvmu-namer", daemon=True)

    def _loop(self) -> None:
        block_in_this_thread()
        while not self._stop.wait(self.every):
            self.threads.update(_threads_now(self.proc))

    def __enter__(self) -> _ThreadNamer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.threads.update(_threads_now(self.proc))


def evidence_live_bpf(duration: float | None, proc: Path = Path("/proc")) -> Evidence:
    with _ThreadNamer(proc) as namer:
        out, elapsed = bpf.run_script(bpf_script(duration),
                                      "Diagnosing kvm events in BPF... Hit Ctrl-C to end." if duration is None
                                      else f"Diagnosing kvm events in BPF for {duration:g} s...")
    threads = namer.threads
    # the window as the kernel saw it (without bpftrace's teardown): the first stamp printed
    m = next(filter(None, (_ELAPSED.fullmatch(line) for line in out.lines)), None)
    return from_bpf_maps(int_maps(out), int(m.group(1)) / 1e9 if m else elapsed, threads)


def evidence_live_ftrace(tracefs: Path | None, duration: float | None) -> Evidence:
    """Fallback without bpftrace: every event through a private ftrace instance (costlier)."""
    import sys

    from tools.kvm_utils.record import record
    from tools.kvm_utils.sources.tracefs import tracefs_mounted
    with tempfile.TemporaryDirectory(prefix="kvmu-diag-") as d, tracefs_mounted(tracefs) as root:
        msg = "Diagnosing kvm events through ftrace" + (f" for {duration:g} s..." if duration else
                                                        "... Hit Ctrl-C to end.")
        res = record(root, Path(d) / "diag.kvmu", duration,
                     on_ready=lambda: print(msg, file=sys.stderr, flush=True))
        ev = evidence_from_file(res.path)
        ev.lost_events = res.lost_events
    ev.source = "ftrace"
    return ev


def evidence_live(engine: str, tracefs: Path | None, duration: float | None) -> Evidence:
    from tools.kvm_utils.sources.tracefs import tracefs_mounted
    if engine == "bpf" or (engine == "auto" and shutil.which("bpftrace")):
        with tracefs_mounted(tracefs):      # bpftrace resolves tracepoints through tracefs
            return evidence_live_bpf(duration)
    return evidence_live_ftrace(tracefs, duration)


# ------------------------------------------------------------------------ output

def render(d: Diagnosis, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(d.to_dict(), indent=2) + "\n"
    out = [f"diagnose: {d.duration_s:.2f} s of kvm events from {d.source}"]
    if d.lost_events:
        out.append(f"  {d.lost_events} events lost (the trace buffer overran): counts and rates below are "
                   "lower bounds; a shorter window, or --engine bpf (counts in the kernel), loses none")
    if changed := d.changed_thresholds():
        out.append("  thresholds set: " + ", ".join(f"{k}={v:g}" for k, v in changed.items()))
    for vm in d.vms:
        out.append(f"  VM {vm['vm']}: {vm['vcpu_threads']} vCPU thread(s), {vm['exits']} exits "
                   f"({vm['exit_rate_per_s']:,.1f}/s), {vm['access_events']} PIO/MMIO/MSR/userspace-exit events")
    if not d.vms:
        out.append("  no VM activity seen (no kvm events): nothing to diagnose")
    out.append("")
    if not d.findings:
        out.append("no known pathology found" + (" (in what could be evaluated, see below)" if d.not_evaluated else ""))
    for i, f in enumerate(d.findings, 1):
        out.append(f"[{i}] {f.vm}: {f.title}  ({f.rule})")
        out += [f"    evidence: {line}" if j == 0 else f"              {line}" for j, line in enumerate(f.evidence)]
        out += _wrap("    advice:   ", f.advice)
        out += _wrap("    fix:      ", f.fix)
        out.append("")
    if d.not_evaluated:
        rules = ", ".join(n["rule"] for n in d.not_evaluated)
        out += ["", f"not evaluated: {rules}: {d.not_evaluated[0]['why']}"]
    return "\n".join(out).rstrip() + "\n"


def _wrap(prefix: str, text: str, width: int = 100) -> list[str]:
    import textwrap
    return textwrap.wrap(text, width, initial_indent=prefix, subsequent_indent=" " * len(prefix),
                         break_on_hyphens=False) or [prefix]
