"""bpftrace engine: program text, JSON parsing and in-kernel aggregates -> Summary (pure),
plus a live run on this host (PVM: accesses are counted, kvm_exit never fires)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess

import pytest

from kvmu_helpers import alive, children, kvm_utils_popen, stderr_has, stop, task_state, wait_for
from tools.kvm_utils.bench import helper_argv
from tools.kvm_utils.render.json import to_dict
from tools.kvm_utils.sources.bpf import bucket_bounds, script, to_summary
from tools.kvm_utils.sources.bpftrace_output import int_maps, parse

# Recorded `bpftrace -f json` output shape (bpftrace 0.17): one "map" record per map,
# multi-keys joined by ",". Values: VMX (isa 1) MSR_WRITE (32) x4 with latencies
# 1000, 2000, 3000, 40000 ns; one PIO 0x608 read paired with the 40000 ns exit.
# Log-linear keys: 1000 -> b=9, s=(1000>>6)&7=7 -> 79; 2000 -> b=10, s=7 -> 87;
# 3000 -> b=11, s=(3000>>8)&7=3 -> 91; 40000 -> b=15, s=(40000>>12)&7=1 -> 121.
RECORDED = """
{"type": "attached_probes", "data": {"probes": 7}}
{"type": "map", "data": {"@a_n": {"2,1544,0": 1, "1,1760,1": 3}}}
{"type": "map", "data": {"@a_paired": {"2,1544,0": 1}}}
{"type": "map", "data": {"@a_sum": {"2,1544,0": 40000}}}
{"type": "map", "data": {"@a_min": {"2,1544,0": 40000}}}
{"type": "map", "data": {"@a_max": {"2,1544,0": 40000}}}
{"type": "map", "data": {"@a_ll": {"2,1544,0,121": 1}}}
{"type": "map", "data": {"@e_n": {"1,32": 4}}}
{"type": "map", "data": {"@e_sum": {"1,32": 46000}}}
{"type": "map", "data": {"@e_min": {"1,32": 1000}}}
{"type": "map", "data": {"@e_max": {"1,32": 40000}}}
{"type": "map", "data": {"@e_ll": {"1,32,79": 1, "1,32,87": 1, "1,32,91": 1, "1,32,121": 1}}}
{"type": "map", "data": {"@t_n": {"4101": 4}}}
"""


def test_bucket_bounds() -> None:
    assert bucket_bounds(5) == (5, 5)
    assert bucket_bounds(79) == (960, 1023)        # b=9: (8+7)<<6 .. (16<<6)-1
    assert bucket_bounds(91) == (2816, 3071)       # b=11: 11<<8 .. (12<<8)-1
    assert bucket_bounds(121) == (36864, 40959)    # b=15: 9<<12 .. (10<<12)-1
    for k, v in ((79, 1000), (87, 2000), (91, 3000), (121, 40000)):
        lo, hi = bucket_bounds(k)
        assert lo <= v <= hi and (hi - lo + 1) / lo <= 0.125


def test_parse_and_summarise_recorded_output() -> None:
    maps = int_maps(parse(RECORDED))
    assert maps["e_ll"][(1, 32, 79)] == 1
    d = to_dict(to_summary(maps, "io"))
    assert d["total_exits"] == 4
    # p50: rank 2 -> bucket 87 upper bound 2047; p99: rank 4 -> bucket 121 -> 40959 clamped to max 40000
    assert {k: d["exits"][0][k] for k in ("reason", "count", "pct", "min_ns", "p50_ns", "p99_ns", "max_ns", "mean_ns")} \
        == {"reason": "MSR_WRITE", "count": 4, "pct": 100.0, "min_ns": 1000, "p50_ns": 2047, "p99_ns": 40000,
            "max_ns": 40000, "mean_ns": 11500.0}
    assert d["approx_percentiles"] is True
    assert d["msr"] == [{"msr": "0x6e0", "dir": "W", "name": "IA32_TSC_DEADLINE", "count": 3, "min_ns": None,
                         "p50_ns": None, "p99_ns": None, "max_ns": None, "mean_ns": None}]
    assert d["pio"] == [{"port": "0x608", "dir": "IN", "count": 1, "min_ns": 40000, "p50_ns": 40000,
                         "p99_ns": 40000, "max_ns": 40000, "mean_ns": 40000.0}]
    assert d["vcpus"][0]["tid"] == 4101 and d["vcpus"][0]["count"] == 4


def test_unknown_isa_and_code_are_named_not_fatal() -> None:
    d = to_dict(to_summary(int_maps(parse('{"type": "map", "data": {"@e_n": {"9,77": 1}, "@e_sum": {"9,77": 5},'
                                          ' "@e_min": {"9,77": 5}, "@e_max": {"9,77": 5}}}')), "latency"))
    assert d["exits"][0]["reason"] == "UNKNOWN(0x4d)" and d["exits"][0]["p50_ns"] == 5


def test_script_shape() -> None:
    s = script("msr", 2.5, pid=42)
    assert "tracepoint:kvm:kvm_msr" in s and "kvm_pio" not in s
    assert "interval:ms:100 { if (nsecs - @kvmu_t0 >= 2500000000) { exit(); } }" in s
    assert "if (pid != 42) { return; }" in s
    assert "kvm_msr" not in script("latency", None) and "interval" not in script("latency", None)
    assert "clear(@kvmu_t0);" in script("latency", None)   # bpftrace would print it at exit
    # no access probe writes @akind in `latency`: reading it there is a bpftrace compile error
    assert "@akind" not in script("latency", None) and "@akind" in script("io", None)


@pytest.mark.root
@pytest.mark.integration
@pytest.mark.parametrize("mode", ["latency", "msr", "io"])
def test_live_every_bpf_mode_runs(mode, kvm_events) -> None:
    """Each mode's program is accepted by this host's bpftrace and ends with a JSON summary
    (a program bpftrace rejects only shows up here, not in the pure tests)."""
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace not installed")
    proc = kvm_utils_popen(mode, "1", "--format", "json")
    try:
        out, err = proc.communicate(timeout=90)     # the 1 s duration ends it
    finally:
        if proc.poll() is None:
            stop(proc, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert json.loads(out)["total_exits"] >= 0 and "Tracing kvm exits" in err


@pytest.mark.root
@pytest.mark.integration
def test_live_io_counts_exactly(helper, kvm_events) -> None:
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace not installed")
    proc = kvm_utils_popen("io", "--format", "json")
    try:
        lines: list[str] = []
        wait_for(lambda: stderr_has(proc, lines, "Tracing kvm exits"), timeout=60, what="bpftrace attach")
        g = json.loads(subprocess.run(helper_argv("pio_out", 800, linger_ms=1000), capture_output=True,
                                      text=True, timeout=60).stdout)
        m = json.loads(subprocess.run(helper_argv("mmio_write", 40), capture_output=True, text=True,
                                      timeout=60).stdout)
    finally:
        out, err = stop(proc, signal.SIGINT, timeout=60)
    assert proc.returncode == 0, err
    d = json.loads(out)
    pio = {(p["port"], p["dir"]): p["count"] for p in d["pio"]}
    assert pio[("0x10", "OUT")] == 800 and g["userspace_exits"] == {"IO": 800}
    assert pio[("0xf1", "OUT")] >= 2          # one done-port write per guest run
    assert {(x["gpa"], x["dir"]): x["count"] for x in d["mmio"]}[("0x20000", "W")] == 40 == m["userspace_exits"]["MMIO"]



@pytest.mark.root
@pytest.mark.integration
def test_bpftrace_does_not_outlive_a_killed_kvm_utils(kvm_events) -> None:
    """SIGKILL cannot be caught, so kvm-utils cannot detach its probes itself: bpftrace is
    started with PR_SET_PDEATHSIG=SIGKILL, and its probes go with it when its parent dies
    (a catchable signal could be missed by bpftrace 0.17 and leave it running)."""
    import os
    import time
    from pathlib import Path
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace not installed")
    proc = kvm_utils_popen("io")
    child = None
    try:
        lines: list[str] = []
        wait_for(lambda: stderr_has(proc, lines, "Tracing kvm exits"), timeout=60, what="bpftrace attach")
        kids = children(proc.pid)
        assert len(kids) == 1 and "bpftrace" in Path(f"/proc/{kids[0]}/comm").read_text()
        child = kids[0]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and alive(child):
            time.sleep(0.1)
        assert not alive(child), f"bpftrace {child} outlived its killed parent: {task_state(child)}"
    finally:
        if proc.poll() is None:
            stop(proc, signal.SIGKILL)
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)
