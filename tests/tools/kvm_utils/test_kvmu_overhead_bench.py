"""bench/kvm_utils_overhead.py: its statistics (pure) and one tiny run end to end (root)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tools.dev.benchstats import median_ci, verdict
from kvmu_helpers import REPO


def test_median_ci_order_statistics() -> None:
    # n = 100: ranks 50 -+ 1.96 * sqrt(100) / 2 = 50 -+ 9.8 -> s[40] .. s[59]
    assert median_ci([float(x) for x in range(100)]) == (49.5, 40.0, 59.0)
    m, lo, hi = median_ci([5.0])
    assert m == lo == hi == 5.0
    m, lo, hi = median_ci([3.0, 1.0, 2.0])
    assert (m, lo, hi) == (2.0, 1.0, 3.0)       # too few pairs: the interval is the whole range


def test_verdict() -> None:
    assert verdict(0.2, 1.1, 2.0) == "< 2 %: met"
    assert verdict(2.4, 3.6, 2.0) == "< 2 %: exceeded"
    assert verdict(1.0, 3.0, 2.0) == "< 2 %: inconclusive"
    assert verdict(1.0, 3.0, None) == ""


@pytest.mark.root
@pytest.mark.integration
@pytest.mark.quiet  # CPU per exit
def test_tiny_run_end_to_end(helper, kvm_events) -> None:
    out = subprocess.run([sys.executable, str(REPO / "bench/kvm_utils_overhead.py"), "--pairs", "1",
                          "--toggle-pairs", "4", "--iterations", "3000", "--modes", "exits,latency", "--json"],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["baseline_exits_per_s"] > 0
    for m in ("exits/toggled", "per-reason x69 (VMX)/toggled", "per-reason x110 (SVM)/toggled", "exits"):
        assert d["modes"][m]["pairs"] >= 1 and "cpu_pct" in d["modes"][m], m
    assert "pairs" in d["modes"]["latency"] or "error" in d["modes"]["latency"]
    assert "exits counters" in out.stdout and "the tool attached as a process" in out.stdout
