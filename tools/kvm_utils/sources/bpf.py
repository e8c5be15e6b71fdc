"""`latency` / `msr` / `io`: exit-handling time aggregated in the kernel by bpftrace.

kvm_exit stores (timestamp, reason) per thread; kvm_entry on the same thread computes the
delta and updates count/sum/min/max maps plus a log-linear histogram (8 sub-buckets per
power of two, so p50/p99 are within 12.5 %, reported as the bucket's upper bound clamped
to the exact min/max). MSR/PIO/MMIO accesses are counted whenever they happen (also on
hosts without kvm_exit, e.g. PVM) and carry the latency of the exit they happened in.
Userspace sees only the maps at the end: cost does not grow with the event rate here.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable

from tools.kvm_utils.aggregate import AccessRow, Bucket, ReasonRow, Stats, Summary, VcpuRow, log2_bucket, pct
from tools.kvm_utils.arch import ISA_TO_VENDOR, exit_reason_name
from tools.kvm_utils.errors import KvmUtilsError, NotAvailable
from tools.kvm_utils.sources import bpfwindow
from tools.kvm_utils.sources.bpftrace_output import Output, int_maps, parse
from tools.kvm_utils.stopping import STOP_SIGNALS, block_in_this_thread

log = logging.getLogger(__name__)

_BUCKET = """
  $v = $d; $b = (uint64)0;
  if ($v >= 4294967296) { $v = $v >> 32; $b += 32; }
  if ($v >= 65536) { $v = $v >> 16; $b += 16; }
  if ($v >= 256) { $v = $v >> 8; $b += 8; }
  if ($v >= 16) { $v = $v >> 4; $b += 4; }
  if ($v >= 4) { $v = $v >> 2; $b += 2; }
  if ($v >= 2) { $v = $v >> 1; $b += 1; }
  $k = $b >= 3 ? $b * 8 + (($d >> ($b - 3)) & 7) : $d;
"""

_EXIT = """
tracepoint:kvm:kvm_exit {{ {pid}@start[tid] = nsecs; @reason[tid] = args->exit_reason; @isa[tid] = args->isa; }}
tracepoint:kvm:kvm_entry /@start[tid]/ {{
  $d = nsecs - @start[tid];
  $r = @reason[tid]; $i = @isa[tid];
  {bucket}
  @e_n[$i, $r] = count(); @e_sum[$i, $r] = sum($d); @e_min[$i, $r] = min($d); @e_max[$i, $r] = max($d);
  @e_ll[$i, $r, $k] = count();
  @t_n[tid] = count();
  {pairing}
  delete(@start[tid]); delete(@reason[tid]); delete(@isa[tid]);
}}
"""

# only with access probes (msr, io): bpftrace refuses a map that is read but never written
_PAIRING = """if (@akind[tid]) {
    $a = @akind[tid]; $x = @akey[tid]; $w = @adir[tid];
    @a_sum[$a, $x, $w] = sum($d); @a_min[$a, $x, $w] = min($d); @a_max[$a, $x, $w] = max($d);
    @a_ll[$a, $x, $w, $k] = count(); @a_paired[$a, $x, $w] = count();
    delete(@akind[tid]); delete(@akey[tid]); delete(@adir[tid]);
  }"""

_ACCESS = {
    "msr": ["tracepoint:kvm:kvm_msr {{ {pid}@a_n[1, (uint64)args->ecx, (uint64)args->write] = count(); "
            "@akind[tid] = 1; @akey[tid] = (uint64)args->ecx; @adir[tid] = (uint64)args->write; }}"],
    "io": ["tracepoint:kvm:kvm_pio {{ {pid}@a_n[2, (uint64)args->port, (uint64)args->rw] = count(); "
           "@akind[tid] = 2; @akey[tid] = (uint64)args->port; @adir[tid] = (uint64)args->rw; }}",
           "tracepoint:kvm:kvm_mmio /args->type != 0/ {{ {pid}@a_n[3, args->gpa, (uint64)(args->type == 2)] = count(); "
           "@akind[tid] = 3; @akey[tid] = args->gpa; @adir[tid] = (uint64)(args->type == 2); }}",
           "tracepoint:kvm:kvm_fast_mmio {{ {pid}@a_n[3, args->gpa, (uint64)1] = count(); "
           "@akind[tid] = 3; @akey[tid] = args->gpa; @adir[tid] = (uint64)1; }}"],
}

_END = "END { clear(@start); clear(@reason); clear(@isa); " + bpfwindow.CLEAR + "%s }"
_END_ACCESS = " clear(@akind); clear(@akey); clear(@adir);"


def script(mode: str, duration: float | None, pid: int | None = None) -> str:
    """The bpftrace program for `latency`, `msr` or `io` (pid: only that VM process)."""
    guard = f"if (pid != {int(pid)}) {{ return; }} " if pid else ""
    # BEGIN fires once every probe is attached: the "ready" line means counting has started
    access = _ACCESS.get(mode, [])
    parts = [bpfwindow.begin(),
             _EXIT.format(pid=guard, bucket=_BUCKET, pairing=_PAIRING if access else "")]
    parts += [p.format(pid=guard) for p in access]
    parts += bpfwindow.stop(duration)
    parts.append(_END % (_END_ACCESS if access else ""))
    return "\n".join(parts) + "\n"


def bucket_bounds(k: int) -> tuple[int, int]:
    """Inclusive value range of log-linear bucket `k` (exact below 8 ns)."""
    if k < 24:      # b < 3: the key is the value itself
        return (k, k)
    b, s = divmod(k, 8)
    return ((8 + s) << (b - 3), ((9 + s) << (b - 3)) - 1)


def ll_stats(count: int, paired: int, total: int, mn: int, mx: int, buckets: dict[int, int]) -> Stats:
    """Stats from in-kernel aggregates: exact count/min/max/mean, percentiles by bucket."""
    if not paired:
        return Stats(count)
    ordered = sorted(buckets.items())

    def percentile(p: int) -> int:
        rank = -(-p * paired // 100)
        seen = 0
        for k, n in ordered:
            seen += n
            if seen >= rank:
                return max(mn, min(mx, bucket_bounds(k)[1]))
        return mx
    log2: dict[tuple[int, int], int] = defaultdict(int)
    for k, n in ordered:      # a log-linear bucket lies inside one power of two: its lo says which
        log2[log2_bucket(bucket_bounds(k)[0])] += n
    hist = tuple(Bucket(lo, hi, n) for (lo, hi), n in sorted(log2.items()))
    return Stats(count, mn, percentile(50), percentile(99), mx, round(total / paired, 1), hist)


def _group(ll: dict[tuple[int, ...], int], width: int) -> dict[tuple[int, ...], dict[int, int]]:
    out: dict[tuple[int, ...], dict[int, int]] = defaultdict(dict)
    for key, n in ll.items():
        out[key[:width]][key[width]] = n
    return out


def to_summary(maps: dict[str, dict[tuple[int, ...], int]], mode: str) -> Summary:
    """Pure: parsed bpftrace maps -> the same Summary `report` builds (approx percentiles)."""
    g = lambda name: maps.get(name, {})  # noqa: E731
    e_ll = _group(g("e_ll"), 2)
    named: dict[str, Stats] = {}
    for key, n in g("e_n").items():
        isa, code = key
        name = exit_reason_name(ISA_TO_VENDOR.get(isa), code)
        named[name] = ll_stats(n, n, g("e_sum")[key], g("e_min")[key], g("e_max")[key], e_ll.get(key, {}))
    total = sum(s.count for s in named.values())
    exits = tuple(ReasonRow(r, pct(s.count, total), s)
                  for r, s in sorted(named.items(), key=lambda kv: (-kv[1].count, kv[0])))
    a_ll = _group(g("a_ll"), 3)
    rows: dict[str, list[AccessRow]] = {"msr": [], "pio": [], "mmio": []}
    kinds = {1: "msr", 2: "pio", 3: "mmio"}
    for key, n in sorted(g("a_n").items(), key=lambda kv: (-kv[1], kv[0][1], kv[0][2])):
        kind, k, w = key
        paired = g("a_paired").get(key, 0)
        st = ll_stats(n, paired, g("a_sum").get(key, 0), g("a_min").get(key, 0), g("a_max").get(key, 0),
                      a_ll.get(key, {}))
        rows[kinds[kind]].append(AccessRow(kinds[kind], k, bool(w), st))
    vcpus = tuple(VcpuRow(tid[0], None, None, n, n) for tid, n in sorted(g("t_n").items()))
    return Summary(total, exits, tuple(rows["msr"]), tuple(rows["pio"]), tuple(rows["mmio"]), vcpus,
                   source=f"bpftrace:{mode}", approx_percentiles=True)


def spawn(program: str, bpftrace: str = "bpftrace", *, json_output: bool = True) -> subprocess.Popen:
    """bpftrace running `program` with JSON output (or its text output: the kprobe engine's
    hist blocks); `stop()` makes it print its maps and exit. It is killed if we die (even
    by SIGKILL), so its probes never outlive us."""
    exe = shutil.which(bpftrace)
    if exe is None:
        raise NotAvailable("bpftrace not found: apt-get install bpftrace")
    return subprocess.Popen([exe, *(["-f", "json"] if json_output else []), "-e", program], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_child_setup)


def _child_setup() -> None:
    """In the child before exec: SIGKILL when the parent dies (no one reads its maps then,
    and its probes go with its file descriptors; a catchable signal can be lost, see
    stop()); SIGINT at its default and the stop signals unblocked: an ignored or blocked
    signal stays so across exec (a background job's SIGINT is ignored), and bpftrace 0.17
    catches SIGINT anyway, but how we stop it must not depend on that."""
    import ctypes
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def stop(proc: subprocess.Popen, every: float = 1.0, give_up: float = 60.0) -> threading.Thread:
    """Make bpftrace print its maps and exit, from a thread (the caller reads its output
    meanwhile; join the thread to wait): SIGINT, sent again every `every` s while it runs,
    SIGKILL after `give_up` s. Once is not enough: bpftrace 0.17's handler only sets a flag,
    which its event loop reads when the signal interrupts epoll_wait or an event arrives, so
    a SIGINT landing just outside epoll_wait (e.g. while it prints its ready line) is never
    acted on by a program without periodic output."""
    def loop() -> None:
        block_in_this_thread()
        deadline = time.monotonic() + give_up
        while time.monotonic() < deadline:
            proc.send_signal(signal.SIGINT)       # a no-op once it has exited
            try:
                proc.wait(timeout=every)
                return
            except subprocess.TimeoutExpired:
                log.info("event=bpftrace_stop_resent pid=%d", proc.pid)
        log.error("event=bpftrace_killed pid=%d after_s=%g", proc.pid, give_up)
        proc.kill()
        proc.wait()
    t = threading.Thread(target=loop, name="kvmu-bpftrace-stop", daemon=True)
    t.start()
    return t


def run_script(program: str, ready_message: str, bpftrace: str = "bpftrace", *,
               json_output: bool = True) -> tuple[Output, float]:
    """Run a bpftrace program that prints `kvm-utils-ready` in BEGIN, until it exits or
    Ctrl-C/SIGTERM (then `stop()`: bpftrace prints its maps). Returns (its stdout without
    the ready line, parsed, seconds from ready to the end), printing `ready_message` to
    stderr once every probe is attached. A program that never got ready, or that failed
    without printing a map, is an error with bpftrace's own words."""
    proc = spawn(program, bpftrace, json_output=json_output)
    lines: list[str] = []
    t_ready = None
    try:
        try:
            for line in proc.stdout:
                if t_ready is None and bpfwindow.READY in line:
                    t_ready = time.monotonic()
                    print(ready_message, file=sys.stderr, flush=True)
                    continue
                lines.append(line)
        except KeyboardInterrupt:
            stopping = stop(proc)
            lines.extend(proc.stdout)
            stopping.join()
        proc.wait(timeout=60)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = parse("".join(lines))
    printed_maps = bool(out.maps or out.hists)
    if t_ready is None or proc.returncode not in (0, -signal.SIGINT) and not printed_maps:
        raise KvmUtilsError(f"bpftrace failed (exit {proc.returncode}): {_errors(err)}")
    return out, time.monotonic() - t_ready


def run(mode: str, duration: float | None, pid: int | None = None, bpftrace: str = "bpftrace") -> Summary:
    """Run the program until `duration` or Ctrl-C, then summarise."""
    out, _ = run_script(script(mode, duration, pid), "Tracing kvm exits in BPF... Hit Ctrl-C to end.", bpftrace)
    summary = to_summary(int_maps(out), mode)
    return name_threads(summary)


def name_threads(summary: Summary, proc_root: str = "/proc") -> Summary:
    """Fill vCPU/VM of the threads bpftrace saw, from /proc (threads gone by now stay unnamed)."""
    from dataclasses import replace
    from pathlib import Path

    from tools.kvm_utils.procs import thread_info
    rows = []
    for v in summary.vcpus:
        info = thread_info(Path(proc_root), v.tid)
        rows.append(replace(v, vcpu=info.vcpu, vm=info.vm) if info else v)
    return replace(summary, vcpus=tuple(rows))


def _errors(stderr: str) -> str:
    lines: Iterable[str] = (ln for ln in stderr.splitlines() if "RLIMIT_MEMLOCK" not in ln)
    return "\n".join(lines).strip() or stderr.strip()
