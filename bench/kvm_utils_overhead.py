"""Overhead of kvm-utils modes on the fastest exit loop this host has, in one run.

    .venv/bin/python bench/kvm_utils_overhead.py [--iterations N] [--rounds R]

Runs the bench helper's userspace-PIO loop (one KVM_EXIT_IO per iteration) alone
(the baseline), then with `kvm-utils exits` (perf counting; also with `--user-reasons`,
11 filtered counters on kvm_userspace_exit), `kvm-utils io` (bpftrace aggregation),
`kvm-utils record` (ftrace instance, every event to a file) and, if it runs here,
`perf kvm stat record` attached. Rounds alternate the modes.

Two measures per mode, both compared with the baseline:
- wall: exits/s of the loop (median over rounds), slowdown = base_rate / rate - 1;
- cpu: the loop's own CPU time per exit (user+sys from wait4 rusage; median), extra ns
  and %. Time the loop spends preempted by other work does not count here, so on a shared
  machine this is the steadier measure of what tracing adds to each exit.
Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.kvm_utils.bench import helper_argv  # noqa: E402


def loop_rate(iterations: int) -> tuple[float, float]:
    """(exits/s wall-clock, CPU ns per exit) of one run of the PIO loop."""
    p = subprocess.Popen(helper_argv("pio_out", iterations), stdout=subprocess.PIPE, text=True)
    text = p.stdout.read()
    p.stdout.close()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"bench helper failed ({p.returncode}): {text}")
    out = json.loads(text)
    n = out["userspace_exits"]["IO"]
    return n / (out["ns"] / 1e9), (ru.ru_utime + ru.ru_stime) * 1e9 / n


def attach(mode: str, tmp: Path) -> subprocess.Popen | None:
    py = [sys.executable, "-m", "tools.kvm_utils"]
    argv = {"exits": py + ["exits", "-q", "--system"],
            "exits-user-reasons": py + ["exits", "-q", "--system", "--user-reasons"], "bpf-io": py + ["io"],
            "record": py + ["record", "-o", str(tmp / "r.kvmu")],
            "perf-kvm-record": ["perf", "kvm", "stat", "record", "-a", "-o", str(tmp / "perf.data")]}[mode]
    p = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(4.0 if mode == "bpf-io" else 1.5)      # counters / probes attached
    if p.poll() is not None:
        print(f"# {mode}: does not run here: {p.stderr.read().strip()[:200]}", file=sys.stderr)
        return None
    return p


def detach(p: subprocess.Popen) -> None:
    os.kill(p.pid, signal.SIGINT)
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    modes = ["exits", "exits-user-reasons", "bpf-io", "record"] + (["perf-kvm-record"] if shutil.which("perf") else [])
    rates: dict[str, list[float]] = {"baseline": [], **{m: [] for m in modes}}
    cpu: dict[str, list[float]] = {"baseline": [], **{m: [] for m in modes}}
    dead: set[str] = set()
    with tempfile.TemporaryDirectory() as d:
        for _ in range(args.rounds):
            r, c = loop_rate(args.iterations)
            rates["baseline"].append(r)
            cpu["baseline"].append(c)
            for m in modes:
                if m in dead:
                    continue
                p = attach(m, Path(d))
                if p is None:
                    dead.add(m)
                    continue
                try:
                    r, c = loop_rate(args.iterations)
                    rates[m].append(r)
                    cpu[m].append(c)
                finally:
                    detach(p)
    base = statistics.median(rates["baseline"])
    base_cpu = statistics.median(cpu["baseline"])
    print(f"{'mode':<20} {'exits/s (median)':>16} {'wall slowdown':>14} {'cpu ns/exit':>12} {'cpu extra':>16}")
    print(f"{'baseline':<20} {base:>16.0f} {'-':>14} {base_cpu:>12.0f} {'-':>16}")
    for m in modes:
        if not rates[m]:
            print(f"{m:<20} {'does not run here':>16}")
            continue
        r, c = statistics.median(rates[m]), statistics.median(cpu[m])
        print(f"{m:<20} {r:>16.0f} {100 * (base / r - 1):>13.1f}% {c:>12.0f} "
              f"{c - base_cpu:>+7.0f} ns {100 * (c / base_cpu - 1):>+5.1f}%")
    print(f"# baseline spread over {len(rates['baseline'])} rounds: {min(rates['baseline']):.0f}..."
          f"{max(rates['baseline']):.0f} exits/s, cpu {min(cpu['baseline']):.0f}...{max(cpu['baseline']):.0f} ns/exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
