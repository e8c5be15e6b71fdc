"""Command runners behind `cli.main` (everything that touches the live host)."""

from __future__ import annotations

import argparse
import json
import sys

from tools.kvm_utils.render import render
from tools.kvm_utils.stopping import stop_signals_interrupt


def run(args: argparse.Namespace) -> int:
    with stop_signals_interrupt():
        return _COMMANDS[args.cmd](args)


def _record(args: argparse.Namespace) -> int:
    from tools.kvm_utils.record import record
    from tools.kvm_utils.sources.tracefs import tracefs_mounted
    with tracefs_mounted(args.tracefs) as root:
        res = record(root, args.output, args.duration, args.buffer_kb)
    print(f"recorded {res.lines} lines in {res.duration_s:.1f} s to {res.path}"
          + (f" ({res.lost_events} events lost: raise --buffer-kb)" if res.lost_events else ""),
          file=sys.stderr)
    return 0


def _exits(args: argparse.Namespace) -> int:
    from tools.kvm_utils.live import run_exits
    return run_exits(args)


def _top(args: argparse.Namespace) -> int:
    from tools.kvm_utils.top import run_top
    return run_top(args)


def _bpf(args: argparse.Namespace) -> int:
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
    sys.stdout.write(diag.render(rules.diagnose(ev, vm=args.vm), args.format))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from tools.kvm_utils import doctor
    checks = doctor.run_checks(args.tracefs)
    print(doctor.format_checks(checks))
    return 0 if all(c.ok or not c.required for c in checks) else 1


def _export(args: argparse.Namespace) -> int:
    from tools.kvm_utils.export import run_export
    return run_export(args)


_COMMANDS = {"record": _record, "exits": _exits, "export": _export, "latency": _bpf, "msr": _bpf, "io": _bpf,
             "bench": _bench, "doctor": _doctor, "diagnose": _diagnose, "top": _top}
