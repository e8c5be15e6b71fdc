"""Overhead of kvm-utils modes on the fastest exit loop this host has, in one run.

    .venv/bin/python bench/kvm_utils_overhead.py [--iterations N] [--rounds R]

Runs the bench helper's userspace-PIO loop (one KVM_EXIT_IO per iteration) alone
(the baseline), then with `kvm-utils exits` (perf counting), `kvm-utils io` (bpftrace
aggregation), `kvm-utils record` (ftrace instance, every event to a file) and, if it runs
here, `perf kvm stat record` attached. Rounds alternate the modes; per mode the median
exits/s is compared with the baseline's: slowdown = baseline_rate / mode_rate - 1.
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


def loop_rate(iterations: int) -> float:
    out = json.loads(subprocess.run(helper_argv("pio_out", iterations), capture_output=True, text=True,
                                    check=True, timeout=600).stdout)
    return out["userspace_exits"]["IO"] / (out["ns"] / 1e9)


def attach(mode: str, tmp: Path) -> subprocess.Popen | None:
    py = [sys.executable, "-m", "tools.kvm_utils"]
    argv = {"exits": py + ["exits", "-q", "--system"], "bpf-io": py + ["io"],
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
    modes = ["exits", "bpf-io", "record"] + (["perf-kvm-record"] if shutil.which("perf") else [])
    rates: dict[str, list[float]] = {"baseline": [], **{m: [] for m in modes}}
    dead: set[str] = set()
    with tempfile.TemporaryDirectory() as d:
        for _ in range(args.rounds):
            rates["baseline"].append(loop_rate(args.iterations))
            for m in modes:
                if m in dead:
                    continue
                p = attach(m, Path(d))
                if p is None:
                    dead.add(m)
                    continue
                try:
                    rates[m].append(loop_rate(args.iterations))
                finally:
                    detach(p)
    base = statistics.median(rates["baseline"])
    print(f"{'mode':<18} {'exits/s (median)':>17} {'slowdown vs baseline':>21}")
    print(f"{'baseline':<18} {base:>17.0f} {'(no tracing)':>21}")
    for m in modes:
        if not rates[m]:
            print(f"{m:<18} {'does not run here':>17}")
            continue
        r = statistics.median(rates[m])
        print(f"{m:<18} {r:>17.0f} {100 * (base / r - 1):>20.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
