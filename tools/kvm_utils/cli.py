"""`kvm-utils`: vm-exit profiling and exit-path microbenchmarks for live KVM hosts."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

from tools.kvm_utils.arch import Vendor
from tools.kvm_utils.diagnose.rules import Thresholds, parse_threshold
from tools.kvm_utils.errors import KvmUtilsError
from tools.kvm_utils.render import FORMATS, render

log = logging.getLogger(__name__)

EPILOG = """examples:
  kvm-utils doctor                       what works on this host, and how to fix what does not
  kvm-utils exits 10                     exit counts per reason/VM/vCPU, 1 s interval, 10 s
  kvm-utils exits -p 4242 -i 5           one QEMU process, 5 s interval, until Ctrl-C
  kvm-utils top                          full-screen live view per VM and reason (r/t/n sort, q quits)
  kvm-utils top --once -i 5 --sort total one 5 s frame as text (also what a pipe gets)
  kvm-utils latency 10 --format json     exit-handling time per reason, aggregated in BPF
  kvm-utils kprobe wakeups 10            who woke which vCPU and how long it had halted (kprobes/fentry)
  kvm-utils msr 10                       which MSRs exit, how often, how long
  kvm-utils io 10                        PIO ports and MMIO GPAs (incl. kvm_fast_mmio)
  kvm-utils record -o run.kvmu 5         record raw kvm events for 5 s (ftrace instance)
  kvm-utils report --input run.kvmu      report a recording ...
  kvm-utils report --input trace.txt     ... or any ftrace text / `trace-cmd report` output
  kvm-utils bench --json                 exit-path microbenchmarks on this host's /dev/kvm
  kvm-utils bench --guest -o kgb         static in-guest benchmark: scp kgb vm:; ssh vm sudo ./kgb
  kvm-utils diagnose 10                  known pathologies (acpi_pm clock, TSC_DEADLINE/IPI storms,
                                         vPMU sampling, HLT wake-ups, RAM faults) -> advice + evidence
  kvm-utils diagnose --vm web1 --input run.kvmu --format json    ... of a recording / ftrace text
  kvm-utils export --listen 0.0.0.0:9745 per-VM exit/event/MSR-write counters for Prometheus
"""


def _threshold(text: str) -> tuple[str, float]:
    try:
        return parse_threshold(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=sorted(FORMATS), default="table", help="output format")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kvm-utils", description=__doc__, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    ap.add_argument("--tracefs", type=Path, default=None,
                    help="tracefs mount (default: find it, mount it at /sys/kernel/tracing if absent)")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    p = sub.add_parser("report", help="summarise a record file or ftrace text")
    p.add_argument("--input", "-i", type=Path, required=True, help="record file, trace, trace_pipe dump or trace-cmd report")
    p.add_argument("--vendor", choices=[v.value for v in Vendor], default=None,
                   help="exit-reason table for numeric reasons (default: detect from the names)")
    _add_format(p)

    p = sub.add_parser("record", help="record raw kvm events from a private ftrace instance")
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("duration", type=float, nargs="?", default=None, help="seconds (default: until Ctrl-C)")
    p.add_argument("--buffer-kb", type=int, default=8192, help="per-CPU ring buffer size")

    p = sub.add_parser("exits", help="live exit counts per reason, VM and vCPU (perf counting mode)")
    p.add_argument("duration", type=float, nargs="?", default=None, help="seconds (default: until Ctrl-C)")
    p.add_argument("-i", "--interval", type=float, default=1.0)
    p.add_argument("-p", "--pid", type=int, action="append", help="only these VM processes")
    p.add_argument("-g", "--guest", action="append", help="only these VM names")
    p.add_argument("-q", "--quiet", action="store_true", help="no interval lines, summary only")
    p.add_argument("--system", action="store_true", help="per-CPU system-wide counters (no per-VM split)")
    p.add_argument("--user-reasons", action="store_true",
                   help="perf engine: split userspace exits by reason (11 filtered counters instead of 1: "
                        "costlier per exit; the bpf engine always splits them)")
    p.add_argument("--engine", choices=("auto", "perf", "bpf", "kprobe"), default="auto",
                   help="perf: kvm_stat's filtered counters, one per exit reason; bpf: one bpftrace program "
                        "whose cost does not grow with the number of reasons; kprobe: exits seen at the vendor's "
                        "exit handler (summary only); auto (default): bpf on VMX/SVM hosts when bpftrace is "
                        "installed, kprobe where kvm_exit is silent (PVM) and kprobes/fentry attach, else perf")
    _add_format(p)

    p = sub.add_parser("top", help="live full-screen view per VM and per reason/event (keys r/t/n sort, q quits)")
    p.add_argument("duration", type=float, nargs="?", default=None, help="seconds (default: until q / Ctrl-C)")
    p.add_argument("-i", "--interval", type=float, default=1.0)
    p.add_argument("-p", "--pid", type=int, action="append", help="only these VM processes")
    p.add_argument("-g", "--guest", action="append", help="only these VM names")
    p.add_argument("--system", action="store_true", help="per-CPU system-wide counters (no per-VM split)")
    p.add_argument("--sort", choices=("rate", "total", "name"), default="rate")
    p.add_argument("--user-reasons", action="store_true", help="split userspace exits by reason (costlier)")
    p.add_argument("--engine", choices=("auto", "perf", "bpf"), default="auto",
                   help="as for `exits`: auto (default) counts in BPF on VMX/SVM hosts when bpftrace is installed")
    p.add_argument("--once", action="store_true",
                   help="count one interval, print one frame and exit (the default when stdout is not a terminal)")

    for name, what in (("latency", "exit-handling time per reason"),
                       ("msr", "MSR accesses per MSR and direction, with exit-handling time"),
                       ("io", "PIO ports and MMIO GPAs, with exit-handling time")):
        p = sub.add_parser(name, help=f"{what}, aggregated in the kernel by bpftrace")
        p.add_argument("duration", type=float, nargs="?", default=None, help="seconds (default: until Ctrl-C)")
        p.add_argument("-p", "--pid", type=int, help="only this VM process")
        if name == "latency":
            p.add_argument("--engine", choices=("auto", "bpf", "kprobe"), default="auto",
                           help="bpf: kvm_exit to kvm_entry (tracepoints); kprobe: time inside the exit handler "
                                "(kprobe/fentry); auto (default): kprobe only where kvm_exit is silent and probes attach")
        _add_format(p)

    p = sub.add_parser("kprobe", help="what no tracepoint shows, from kprobes/fentry on KVM functions (bpftrace)")
    p.add_argument("view", choices=("handling", "wakeups", "timers", "halts"),
                   help="handling: time in the exit handler per reason (= latency --engine kprobe); wakeups: who "
                        "woke which vCPU, how long it had halted, kicks, posted-interrupt wake-ups; timers: LAPIC "
                        "timer expiries; halts: halt durations, pause-loop exits")
    p.add_argument("duration", type=float, nargs="?", default=None, help="seconds (default: until Ctrl-C)")
    p.add_argument("-p", "--pid", type=int, action="append", help="only these VM processes")
    p.add_argument("-g", "--guest", action="append", help="only these VM names")
    p.add_argument("--format", choices=("table", "json"), default="table")

    p = sub.add_parser("bench", help="exit-path microbenchmarks through /dev/kvm (tiny guest)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--tests", default=None, help="comma-separated subset")
    p.add_argument("--target-cycles", type=int, default=1 << 30,
                   help="double iterations until a run takes this many TSC cycles")
    p.add_argument("--repeat", type=int, default=3, help="runs per test; the fastest counts")
    p.add_argument("--guest", action="store_true",
                   help="build the static in-guest benchmark (cpuid, PIO, MMIO, rdtsc, clock_gettime) to copy into a VM")
    p.add_argument("-o", "--output", type=Path, default=None, help="with --guest: where to put the binary")
    p.add_argument("--run", action="store_true",
                   help="with --guest: also run it here (inside a VM; on a host as a smoke check)")

    p = sub.add_parser("diagnose", help="turn known exit pathologies into advice, with the evidence")
    p.add_argument("duration", type=float, nargs="?", default=None, help="seconds live (default: until Ctrl-C)")
    p.add_argument("--input", "-i", type=Path, default=None,
                   help="diagnose a record file / ftrace text instead of the live host")
    p.add_argument("--vm", default=None, help="only this VM (QEMU -name guest=NAME)")
    p.add_argument("--engine", choices=("auto", "bpf", "ftrace"), default="auto",
                   help="live source: bpftrace in-kernel counts (default when installed) or an ftrace instance")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--threshold", action="append", type=_threshold, default=None, metavar="NAME=VALUE",
                   help="change a rule's threshold (repeatable), e.g. tsc_deadline_per_s=20000; "
                        "names: " + ", ".join(f.name for f in dataclasses.fields(Thresholds)))

    p = sub.add_parser("export", help="serve exit, event and MSR-write counts per VM as Prometheus metrics, until stopped")
    p.add_argument("--listen", default="127.0.0.1:9745", help="HOST:PORT of /metrics (default 127.0.0.1:9745)")
    p.add_argument("-i", "--interval", type=float, default=5.0, help="seconds between two reads of the counters")
    p.add_argument("--engine", choices=("auto", "perf", "bpf"), default="auto", help="as for `exits`")
    p.add_argument("--msr", action="append", default=None,
                   help="MSRs whose writes to count (perf engine; default: TSC_DEADLINE, x2APIC ICR/EOI/TMICT/LVTT)")

    sub.add_parser("doctor", help="check tracefs, kvm tracepoints, perf, BPF, kprobes, the symbols the kprobe engine needs; say how to fix")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s %(message)s")
    try:
        return _dispatch(args)
    except KvmUtilsError as e:
        print(f"kvm-utils: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:  # stopped before it counted anything (a command's loop catches it after)
        print("kvm-utils: stopped before it started", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.cmd == "report":
        from tools.kvm_utils.report import summarize_file
        if not args.input.is_file():
            raise KvmUtilsError(f"--input {args.input}: no such file")
        summary = summarize_file(args.input, Vendor(args.vendor) if args.vendor else None)
        sys.stdout.write(render(summary, args.format))
        return 0
    from tools.kvm_utils import commands
    return commands.run(args)


if __name__ == "__main__":
    sys.exit(main())
