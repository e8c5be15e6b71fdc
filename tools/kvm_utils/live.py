"""`exits`: live exit counts per reason, VM and vCPU (counting mode, nothing per event in
userspace).

perf engine (kvm_stat's): counters per vCPU thread (found in /proc, re-scanned every
interval so new VMs and vCPUs are picked up), or per CPU system-wide when no VM process is
found or `--system`; one filtered counter per exit reason on kvm_exit.
bpf engine: one bpftrace program keyed by (thread, reason), see sources/bpfcount.py.
`--engine auto` picks BPF where kvm_exit has a reason table (VMX/SVM), see choose_engine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tools.kvm_utils import procs
from tools.kvm_utils.arch import SVM_EXIT_REASONS, USERSPACE_EXIT_REASONS, VMX_EXIT_REASONS, Vendor
from tools.kvm_utils.errors import NotAvailable
from tools.kvm_utils.record import host_vendor
from tools.kvm_utils.sources import bpfwindow, perf
from tools.kvm_utils.sources.tracefs import available_kvm_events, tracefs_mounted, tracepoint_id
from tools.kvm_utils.stopping import block_in_this_thread, deferred

log = logging.getLogger(__name__)

#: kvm_userspace_exit reasons worth their own counter (the rest are rare)
USER_REASONS = (2, 3, 5, 6, 8, 9, 10, 17, 24, 29, 30)
#: tracepoints counted whole: what an exit did, also on hosts whose kvm_exit is silent (PVM)
#: (not kvm_emulate_insn: on a software hypervisor it fires per guest instruction and
#: counting it costs ~10 % of the exit rate, measured with bench/kvm_utils_overhead.py)
EVENT_COUNTERS = ("kvm_pio", "kvm_mmio", "kvm_fast_mmio", "kvm_msr", "kvm_cpuid", "kvm_hypercall")


@dataclass(frozen=True)
class Spec:
    kind: str            # "exit" | "user" | "event"
    label: str
    tp_id: int
    filter_expr: str | None


@dataclass(frozen=True)
class Target:
    tid: int             # -1: system-wide on `cpu`
    cpu: int
    vm: str
    vcpu: int | None
    pid: int | None


def counter_specs(tracefs: Path, vendor: Vendor | None, user_reasons: bool = False,
                  events: tuple[str, ...] = EVENT_COUNTERS) -> list[Spec]:
    """The counters to open per target. Every counter attached to a tracepoint costs on each
    hit (~40-60 ns CPU here, measured by bench/kvm_utils_overhead.py), so userspace exits
    get one unfiltered counter unless `user_reasons` asks for the per-reason split."""
    have, wanted = set(available_kvm_events(tracefs)), events
    if "kvm_exit" not in have:
        raise NotAvailable(f"tracepoint kvm:kvm_exit missing under {tracefs}/events/kvm: load kvm")
    exit_id = tracepoint_id(tracefs, "kvm", "kvm_exit")
    if vendor is Vendor.INTEL:
        specs = [Spec("exit", n, exit_id, f"exit_reason=={c}") for c, n in VMX_EXIT_REASONS.items()]
    elif vendor is Vendor.AMD:
        specs = [Spec("exit", n, exit_id, f"exit_reason=={c}") for c, n in SVM_EXIT_REASONS.items()]
    else:   # no vmx/svm flag (nested PVM): one unfiltered counter, reasons are unknowable
        specs = [Spec("exit", "kvm_exit(all)", exit_id, None)]
    if "kvm_userspace_exit" in have:
        uid = tracepoint_id(tracefs, "kvm", "kvm_userspace_exit")
        if user_reasons:
            specs += [Spec("user", USERSPACE_EXIT_REASONS[c], uid, f"reason=={c} && errno>=0") for c in USER_REASONS]
        else:
            specs.append(Spec("user", "ALL", uid, None))
    specs += [Spec("event", e, tracepoint_id(tracefs, "kvm", e), None) for e in wanted if e in have]
    return specs


@dataclass
class Counters:
    specs: list[Spec]
    fds: dict[tuple[Target, Spec], int] = field(default_factory=dict)
    last: dict[tuple[Target, Spec], int] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)

    def add_target(self, t: Target) -> bool:
        opened = []
        try:
            for s in self.specs:
                fd = perf.open_tracepoint(s.tp_id, t.tid, t.cpu, s.filter_expr)
                opened.append(((t, s), fd))
        except ProcessLookupError:      # the thread exited while we opened its counters
            for _, fd in opened:
                os.close(fd)
            return False
        except BaseException:
            for _, fd in opened:
                os.close(fd)
            raise
        for key, fd in opened:
            self.fds[key] = fd
            self.last[key] = 0
        self.targets.append(t)
        return True

    def delta(self) -> Counter:
        """Counts since the previous call, keyed by (target, spec)."""
        out: Counter = Counter()
        for key, fd in self.fds.items():
            v = perf.read_count(fd)
            out[key] = v - self.last[key]
            self.last[key] = v
        return out

    def enable(self, on: bool) -> None:
        for fd in self.fds.values():
            perf.set_enabled(fd, on)

    def close(self) -> None:
        """Close every counter; a delta() after this returns nothing."""
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


class BpfCounters:
    """The Counters interface (add_target, delta, close) over one bpftrace counting program
    (sources/bpfcount.py): every thread is seen without add_target, any number of reasons
    for one map update per exit. The program prints its (cumulative) maps every `flush_s`;
    a reader thread adds what changed to what the next delta() returns. close()
    stops bpftrace (bpf.stop: it prints what is left) and waits for the last counts, which
    one more delta() returns."""

    def __init__(self, tracefs: Path, pids: set[int], flush_s: float = 0.25,
                 events: tuple[str, ...] = EVENT_COUNTERS) -> None:
        import threading

        from tools.kvm_utils.sources import bpf, bpfcount
        # mounted until bpftrace has attached: it resolves the tracepoints through tracefs
        # (a host without systemd, such as the nested-SVM guest's init, has it unmounted)
        with tracefs_mounted(tracefs) as root:
            have = set(available_kvm_events(root))
            if "kvm_exit" not in have:
                raise NotAvailable("tracepoint kvm:kvm_exit missing: load kvm")
            self.events = [e for e in events if e in have]
            self.targets: list[Target] = []
            self.fds: dict = {}                  # no perf counters: for the callers' log lines
            self._target_of = bpfcount.thread_targets(Path("/proc"),
                                                      lambda tid, vm, vcpu, pid: Target(tid, -1, vm, vcpu, pid))
            self._specs: dict[tuple[str, str], Spec] = {}
            self._pending: Counter = Counter()
            self._lock = threading.Lock()
            self._ready = threading.Event()
            self._proc = bpf.spawn(bpfcount.count_script(self.events, flush_s, pids))
            self._reader = threading.Thread(target=self._read, name="kvmu-bpf-reader", daemon=True)
            self._reader.start()
            while not self._ready.wait(0.1):
                if self._proc.poll() is not None:
                    self._reader.join(timeout=5)
                    raise NotAvailable(f"bpftrace failed (exit {self._proc.returncode}): "
                                       f"{self._proc.stderr.read().strip()[-400:]}")

    def _spec(self, kind: str, label: str) -> Spec:
        return self._specs.setdefault((kind, label), Spec(kind, label, 0, None))

    def _read(self) -> None:
        from tools.kvm_utils.sources import bpfcount
        block_in_this_thread()
        maps: dict[str, dict] = {}
        deltas = bpfcount.Deltas()

        def publish() -> None:
            counts = bpfcount.to_counts(deltas(maps), self.events, self._target_of, self._spec)
            with self._lock:
                self._pending.update(counts)
        for line in self._proc.stdout:
            if bpfwindow.READY in line:
                self._ready.set()
            rec = bpfcount.parse_record(line)
            if rec == "tick":
                publish()
                maps = {}
            elif rec is not None:
                maps.setdefault(rec[0], {}).update(rec[1])
        publish()                            # what bpftrace printed on its way out

    def add_target(self, t: Target) -> bool:
        return False

    def delta(self) -> Counter:
        with self._lock:
            d, self._pending = self._pending, Counter()
        return d

    def close(self) -> None:
        from tools.kvm_utils.sources import bpf
        bpf.stop(self._proc).join()
        self._reader.join(timeout=30)


def select_targets(args: argparse.Namespace, seen: set[int], proc: Path = Path("/proc")) -> list[Target]:
    found = []
    for p in procs.vm_processes(proc):
        if args.pid and p.pid not in args.pid or args.guest and p.name not in args.guest:
            continue
        for tid, vcpu in sorted(p.vcpu_tids.items()):
            if tid not in seen:
                found.append(Target(tid, -1, p.name, vcpu, p.pid))
    return found


def start_targets(counters: Counters | BpfCounters, args: argparse.Namespace, engine: str, seen: set[int]) -> bool:
    """Open the first targets of `exits`/`top`; True when counting is per CPU (system-wide):
    asked for, or no VM process found and none named. The BPF engine sees every thread by
    itself (per-thread scope, no targets)."""
    if engine == "bpf":
        return False
    system = getattr(args, "system", False)
    targets = [] if system else select_targets(args, seen)
    if not targets and not (args.pid or args.guest):
        system = True
        targets = [Target(-1, c, "(all)", None, None) for c in range(os.cpu_count() or 1)]
    for t in targets:
        if counters.add_target(t):
            seen.add(t.tid)
    return system


def pick_up_new_threads(counters: Counters | BpfCounters, args: argparse.Namespace, engine: str, system: bool,
                        seen: set[int]) -> None:
    """Per-thread perf counting: counters for the vCPU threads that appeared since."""
    if system or engine == "bpf":
        return
    for t in select_targets(args, seen):
        if counters.add_target(t):
            seen.add(t.tid)


def choose_engine(requested: str, vendor: Vendor | None, have_bpftrace: bool) -> str:
    """`auto`: BPF where kvm_exit carries a reason table (VMX/SVM), because perf needs one
    filtered counter per reason there and every exit pays for every filter (~12 ns each,
    measured: +8.9 % per exit for the 69 VMX reasons); perf elsewhere (a software
    hypervisor's silent kvm_exit: two unfiltered counters per exit, +0.8 %)."""
    if requested != "auto":
        return requested
    return "bpf" if vendor is not None and have_bpftrace else "perf"


def open_counters(args: argparse.Namespace, vendor: Vendor | None) -> tuple[Counters | BpfCounters, str]:
    """The counters `exits` and `top` read, for the engine `--engine` and this host call for."""
    import shutil
    engine = choose_engine(getattr(args, "engine", "perf"), vendor, shutil.which("bpftrace") is not None)
    if engine == "bpf":
        pids: set[int] = set(args.pid or ())
        if args.guest:
            pids |= {p.pid for p in procs.vm_processes() if p.name in args.guest}
            if not pids:
                raise NotAvailable(f"no VM process named {', '.join(args.guest)} (guest=NAME in its command line)")
        return BpfCounters(args.tracefs, pids), engine
    perf.raise_fd_limit()
    with tracefs_mounted(args.tracefs) as root:
        return Counters(counter_specs(root, vendor, getattr(args, "user_reasons", False))), engine


def run_exits(args: argparse.Namespace) -> int:
    vendor = Vendor(v) if (v := host_vendor()) else None
    counters, engine = open_counters(args, vendor)
    if engine == "bpf":
        print("Counting kvm exits in BPF... Hit Ctrl-C to end.", file=sys.stderr, flush=True)
    seen: set[int] = set()
    totals: Counter = Counter()
    t0 = time.monotonic()
    system = False
    try:
        system = start_targets(counters, args, engine, seen)
        log.info("event=counting targets=%d counters=%d vendor=%s", len(counters.targets),
                 len(counters.fds), vendor)
        if engine != "bpf":  # the BPF engine said so when its program attached
            print(f"Counting kvm exits with {len(counters.fds)} perf counters... Hit Ctrl-C to end.",
                  file=sys.stderr, flush=True)
        deadline = None if args.duration is None else t0 + args.duration
        try:
            while deadline is None or time.monotonic() < deadline:
                step = args.interval if deadline is None else min(args.interval, deadline - time.monotonic())
                time.sleep(max(0.0, step))
                with deferred():        # a stop signal must not fall between taking and adding
                    d = counters.delta()
                    totals.update(d)
                if not args.quiet and args.format == "table":
                    print(interval_line(d, time.monotonic() - t0, step), flush=True)
                pick_up_new_threads(counters, args, engine, system, seen)
        except KeyboardInterrupt:           # Ctrl-C, SIGTERM (stopping.py)
            pass
        with deferred():
            totals.update(counters.delta())
    finally:
        elapsed = time.monotonic() - t0
        counters.close()
    totals.update(counters.delta())         # the BPF engine's last counts arrive on close
    summary = summarize_counts(totals, elapsed, vendor, system, engine)
    sys.stdout.write(render_counts(summary, args.format))
    return 0


def interval_line(d: Counter, at: float, step: float) -> str:
    by_label: Counter = Counter()
    for (t, s), n in d.items():
        if n:
            by_label[(s.kind, s.label)] += n
    exits = sum(n for (k, _), n in by_label.items() if k == "exit")
    top = ", ".join(f"{lbl} {n}" for (k, lbl), n in by_label.most_common(6))
    return f"[{at:7.1f}s] exits {exits} ({exits / step if step > 0 else 0:.0f}/s)  {top or 'idle'}"


def summarize_counts(totals: Counter, elapsed: float, vendor: Vendor | None, system: bool,
                     engine: str = "perf") -> dict:
    """Pure: counter totals -> the `exits` JSON document."""
    rate = (lambda n: round(n / elapsed, 1)) if elapsed > 0 else (lambda n: 0.0)
    exits: Counter = Counter()
    user: Counter = Counter()
    events: Counter = Counter()
    vms: Counter = Counter()
    vcpus: dict[int, list] = {}
    for (t, s), n in totals.items():
        {"exit": exits, "user": user, "event": events}[s.kind][s.label] += n
        if t.tid >= 0:
            row = vcpus.setdefault(t.tid, [t, 0, 0])
            if s.kind == "exit":
                row[1] += n
                vms[(t.vm, t.pid)] += n
            else:
                row[2] += n
    total = sum(exits.values())
    ordered = lambda c: sorted(((k, n) for k, n in c.items() if n), key=lambda kv: (-kv[1], kv[0]))  # noqa: E731
    return {
        "mode": f"{engine}-counting", "scope": "system" if system else "threads",
        "vendor": vendor.value if vendor else None, "duration_s": round(elapsed, 3),
        "total_exits": total,
        "exits": [{"reason": r, "count": n, "pct": round(100 * n / total, 2) if total else 0.0, "rate": rate(n)}
                  for r, n in ordered(exits)],
        "userspace_exits": [{"reason": r, "count": n, "rate": rate(n)} for r, n in ordered(user)],
        "events": [{"event": e, "count": n, "rate": rate(n)} for e, n in ordered(events)],
        "vms": [{"vm": vm, "pid": pid, "count": n, "rate": rate(n)}
                for (vm, pid), n in sorted(vms.items(), key=lambda kv: (-kv[1], kv[0][0]))],
        "vcpus": [{"tid": tid, "vcpu": t.vcpu, "vm": t.vm, "count": ex, "events": ev}
                  for tid, (t, ex, ev) in sorted(vcpus.items())],
    }


def render_counts(d: dict, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(d, indent=2) + "\n"
    if fmt == "csv":
        rows = ["section,key,count,rate"]
        rows += [f"exit,{r['reason']},{r['count']},{r['rate']}" for r in d["exits"]]
        rows += [f"userspace_exit,{r['reason']},{r['count']},{r['rate']}" for r in d["userspace_exits"]]
        rows += [f"event,{r['event']},{r['count']},{r['rate']}" for r in d["events"]]
        rows += [f"vm,{r['vm']},{r['count']},{r['rate']}" for r in d["vms"]]
        rows += [f"vcpu,{r['tid']},{r['count']}," for r in d["vcpus"]]
        return "\n".join(rows) + "\n"
    out = [f"summary: {d['duration_s']:.1f} s, {d['total_exits']} exits, scope {d['scope']}, "
           f"vendor {d['vendor'] or 'unknown (no vmx/svm flag)'}"]
    for title, key, rows in (("reason", "reason", d["exits"]), ("userspace exit", "reason", d["userspace_exits"]),
                             ("event", "event", d["events"]), ("vm", "vm", d["vms"])):
        if rows:
            w = max(len(title), *(len(str(r[key])) for r in rows))
            out += ["", f"{title:<{w}}  {'count':>10}  {'rate/s':>10}"]
            out += [f"{str(r[key]):<{w}}  {r['count']:>10}  {r['rate']:>10.1f}" for r in rows]
    if d["vcpus"]:
        out += ["", f"{'tid':>8}  {'vm':<16} {'vcpu':>4}  {'exits':>10}  {'events':>10}"]
        out += [f"{r['tid']:>8}  {r['vm']:<16} {r['vcpu'] if r['vcpu'] is not None else '-':>4}  "
                f"{r['count']:>10}  {r['events']:>10}" for r in d["vcpus"]]
    return "\n".join(out) + "\n"
