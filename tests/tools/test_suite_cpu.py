"""tools/dev/suite_cpu.py: a worker's CPU, children included, counted in a cpuacct cgroup
of its own (the real cgroup v1 hierarchy); the timeline's summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.dev.suite_cpu import CPUACCT, WorkerCpu, parse, summary

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"


def test_a_childs_cpu_counts_and_the_group_goes_away() -> None:
    if os.geteuid() != 0 or not (CPUACCT / "cpuacct.usage").exists():
        pytest.skip("needs root and cgroup v1's cpuacct")
    # in a child of its own: moving the test's worker would take its timeline column away
    code = ("import subprocess, sys\nfrom tools.dev.suite_cpu import WorkerCpu\n"
            "w = WorkerCpu(sys.argv[1])\nw.since_last()\n"
            f"subprocess.run([sys.executable, '-c', {BURN!r}], check=True)\n"
            "print(w.since_last(), w.group.exists())\nw.close()\nprint(w.group)\n")
    name = f"hyb-suite-test-{os.getpid()}"
    r = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True, check=True,
                       cwd=Path(__file__).resolve().parents[2])
    used, existed, group = r.stdout.split()
    assert 0.45 <= float(used) < 5 and existed == "True" and group == "None", r.stdout
    assert not (CPUACCT / name).exists()


def test_without_the_hierarchy_nothing_is_measured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("tools.dev.suite_cpu.CPUACCT", tmp_path / "none")
    w = WorkerCpu("x")
    assert w.group is None and w.since_last() is None
    w.close()


def test_the_summary_adds_up_by_worker_group_and_test(tmp_path: Path) -> None:
    tl = tmp_path / "tl"
    tl.write_text("gw0 100.0 101.0 setup 0.5 tests/a.py::t@machine\n"
                  "gw0 101.0 111.0 call 9.5 tests/a.py::t@machine\n"
                  "gw1 100.0 104.0 call - tests/b.py::u[x y]\n"
                  "gw1 104.0 110.0 call 2.0 tests/b.py::v\n")
    rows = parse(tl)
    assert rows[2] == ("gw1", 100.0, 104.0, "call", None, "tests/b.py::u[x y]")
    out = summary(rows)
    assert out.splitlines()[0] == "span 11 s; test phases 21 worker-s; CPU 12 CPU-s (1.09 CPUs on average)"
    assert "gw0         11     10" in out and "gw1         10      2" in out
    assert "  10.0    11.0  machine" in out and "  10.0    11.0  tests/a.py::t" in out
