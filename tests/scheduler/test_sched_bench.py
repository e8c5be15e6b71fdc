"""bench/placement.py runs end to end in a tiny configuration (SQLite, two replicas,
through the API) and finds no overcommit; the real numbers are in scheduler/README.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_placement_bench_tiny():
    out = subprocess.run([sys.executable, str(REPO / "bench/placement.py"), "--hosts", "20", "--requests", "60",
                          "--clients", "4", "--stores", "sqlite", "--no-openstack"],
                         capture_output=True, text=True, timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    row = next(ln for ln in out.stdout.splitlines() if ln.startswith("hybrid-kvm sqlite"))
    assert row.rstrip().endswith("none"), row  # overcommit column
    assert "offline FFD places" in out.stdout
    # the claim thread is found by its OS thread name (hyb-claims) and did the claiming
    cpu = next(ln for ln in out.stdout.splitlines() if "server CPU per request" in ln)
    claim = float(cpu.split("claim thread ")[1].split(",")[0])
    assert claim > 0, cpu
