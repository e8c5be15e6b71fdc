"""Command runners behind `cli.main` (everything that touches the live host)."""

from __future__ import annotations

import argparse
import json
import sys

from tools.kvm_utils.render import render, render_view
from tools.kvm_utils.stopping import stop_signals_interrupt


def run(args: argparse.Namespace) -> int:
    with stop_signals_interrupt():
        return _COMMANDS[args.cmd](args)


def _record(args: argparse.Namespace) -> int:
    from tools.kvm_utils.record import record
    from tools.kvm_utils.sources.tracefs import tracefs_mounted
    with tracefs_mounted(args.tracefs) as root:
        res = record(root, args.output, args.duration, args.buffer_kb,
                     on_ready=lambda: print(f"Recording kvm events to {args.output}..."
                                            + ("" if args.duration else " Hit Ctrl-C to end."),
                                            file=sys.stderr, flush=True))
    print(f"recorded {res.lines} lines in {res.duration_s:.1f} s to {res.path}"
          + (f" ({res.lost_events} events lost: raise --buffer-kb)" if res.lost_events else ""),
          file=sys.stderr)
    return 0


def _exits(args: argparse.Namespace) -> int:
    if _wants_kprobe(args, "exits"):
        return _kprobe_exits(args)
    from tools.kvm_utils.live import run_exits
    return run_exits(args)


def _top(args: argparse.Namespace) -> int:
    from tools.kvm_utils.top import run_top
    return run_top(args)


def _bpf(args: argparse.Namespace) -> int:
    if args.cmd == "latency" and _wants_kprobe(args, "latency"):
        return _kprobe_latency(args)
    from tools.kvm_utils.sources import bpf
    from tools.kvm_utils.sources.tracefs import tracefs_mounted
    with tracefs_mounted(args.tracefs):      # bpftrace resolves tracepoints through tracefs
        summary = bpf.run(args.cmd, args.duration, pid=args.pid)
    sys.stdout.write(render(summary, args.format))
    return 0


def _bench(args: argparse.Namespace) -> int:
    from tools.kvm_utils import bench
    tests = args.tests.split(",") if args.tests else None
    if args.guest:
        exe = bench.guest_bench_path(args.output)
        if not args.run:
            print(exe)
            print(f"static binary: copy it into a VM and run it as root there, e.g.\n"
                  f"  scp {exe} VM:/tmp/kgb && ssh VM sudo /tmp/kgb [--tests cpuid,pio_in] [--port 0xb008]",
                  file=sys.stderr)
            return 0
        target = args.target_cycles if args.target_cycles != 1 << 30 else 1 << 28
        d = bench.run_guest_bench(exe, tests, target, args.repeat)
        print(json.dumps(d, indent=2) if args.json else bench.format_guest(d))
        return 0 if all("error" not in r for r in d["results"]) else 1
    results = bench.run_all(tests, args.target_cycles, args.repeat)
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        print(bench.format_table(results))
    return 0 if all(r.error is None for r in results) else 1


def _diagnose(args: argparse.Namespace) -> int:
    from tools.kvm_utils.diagnose import rules, run as diag
    if args.input is not None:
        ev = diag.evidence_from_file(args.input)
    else:
        ev = diag.evidence_live(args.engine, args.tracefs, args.duration)
    if args.vm and args.vm not in ev.vms():
        print(f"diagnose: VM {args.vm!r} showed no kvm activity (seen: {', '.join(ev.vms()) or 'none'})",
              file=sys.stderr)
    th = rules.with_thresholds(args.threshold)
    sys.stdout.write(diag.render(rules.diagnose(ev, th, vm=args.vm), args.format))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from tools.kvm_utils import doctor
    checks = doctor.run_checks(args.tracefs)
    print(doctor.format_checks(checks))
    return 0 if all(c.ok or not c.required for c in checks) else 1


def _export(args: argparse.Namespace) -> int:
    from tools.kvm_utils.export import run_export
    return run_export(args)


def _wants_kprobe(args: argparse.Namespace, question: str) -> bool:
    """`--engine kprobe`, or `auto` where tracepoints cannot answer (kprobe.auto_picks_kprobe);
    auto says on stderr why it did or did not take the kprobe engine on such a host."""
    engine = getattr(args, "engine", "auto")
    if engine != "auto":
        return engine == "kprobe"
    from tools.kvm_utils.record import host_vendor
    cpu = host_vendor()
    if cpu is not None:
        return False                # kvm_exit fires with reasons: the tracepoint engines answer
    from tools.kvm_utils import doctor
    from tools.kvm_utils.sources import kprobe
    support = doctor.kprobe_engine_support(args.tracefs)
    use, why = kprobe.auto_picks_kprobe(question, cpu, support.kind, support.why)
    if use:
        try:
            kprobe.prepare("handling", args.tracefs)
        except kprobe.KprobeUnavailable as e:
            use, why = False, f"{why}, but {e}"
    print(f"kvm-utils: --engine auto: {'kprobe' if use else 'tracepoints'}: {why}", file=sys.stderr)
    return use


def _pids(args: argparse.Namespace) -> set[int]:
    """-p PIDs plus the processes of -g NAMEs (QEMU -name guest=NAME)."""
    from tools.kvm_utils import procs
    from tools.kvm_utils.errors import NotAvailable
    pids = set(args.pid or ()) if isinstance(args.pid, list) else ({args.pid} if args.pid else set())
    names = getattr(args, "guest", None)
    if names:
        found = {p.pid for p in procs.vm_processes() if p.name in names}
        if not found:
            raise NotAvailable(f"no VM process named {', '.join(names)} (guest=NAME in its command line)")
        pids |= found
    return pids


def _kprobe_run(args: argparse.Namespace, view: str):
    from tools.kvm_utils.sources import kprobe
    from tools.kvm_utils.sources.tracefs import tracefs_mounted
    with tracefs_mounted(args.tracefs) as root:     # bpftrace resolves tracepoints through tracefs
        plan = kprobe.prepare(view, root)
        for lost in plan.lost:
            print(f"kvm-utils: kprobe {view}: {lost}", file=sys.stderr)
        parsed, elapsed = kprobe.run(plan, args.duration, _pids(args))
    return plan, parsed, elapsed


def _kprobe_exits(args: argparse.Namespace) -> int:
    """`exits --engine kprobe`: exit handler calls per reason and thread, in `exits`' document."""
    from pathlib import Path

    from tools.kvm_utils.arch import Vendor
    from tools.kvm_utils.live import Spec, Target, render_counts, summarize_counts
    from tools.kvm_utils.record import host_vendor
    from tools.kvm_utils.sources import bpfcount, kprobe
    _, parsed, elapsed = _kprobe_run(args, "handling")
    target_of = bpfcount.thread_targets(Path("/proc"), lambda tid, vm, vcpu, pid: Target(tid, -1, vm, vcpu, pid))
    totals = kprobe.handling_counts(parsed, target_of, lambda kind, label: Spec(kind, label, -1, None))
    vendor = Vendor(v) if (v := host_vendor()) else None
    sys.stdout.write(render_counts(summarize_counts(totals, elapsed, vendor, False, "kprobe"), args.format))
    return 0


def _kprobe_latency(args: argparse.Namespace) -> int:
    """`latency --engine kprobe`: time in the exit handler per reason (`kprobe handling` too)."""
    from tools.kvm_utils.sources import bpf, kprobe
    _, parsed, _ = _kprobe_run(args, "handling")
    sys.stdout.write(render(bpf.name_threads(kprobe.handling_summary(parsed)), args.format))
    return 0


def _kprobe(args: argparse.Namespace) -> int:
    """`kprobe handling|wakeups|timers|halts`."""
    from pathlib import Path

    from tools.kvm_utils.procs import thread_info
    from tools.kvm_utils.sources import kprobe
    if args.view == "handling":
        return _kprobe_latency(args)
    plan, parsed, elapsed = _kprobe_run(args, args.view)

    def name(tid: int) -> str:
        info = thread_info(Path("/proc"), tid)
        return f"{info.vm} vCPU {info.vcpu} (tid {tid})" if info and info.vm else f"tid {tid}"
    sys.stdout.write(render_view(kprobe.view_summary(args.view, parsed, elapsed, plan, name), args.format))
    return 0


_COMMANDS = {"record": _record, "exits": _exits, "export": _export, "latency": _bpf, "msr": _bpf, "io": _bpf,
             "bench": _bench, "doctor": _doctor, "diagnose": _diagnose, "top": _top,
             "kprobe": _kprobe}
