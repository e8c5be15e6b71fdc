"""`report` on recorded traces (tests/data/traces/README.md says how they were made): every
number below is computed by hand from the timestamps in the file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.kvm_utils.report import summarize_file
from tools.kvm_utils.render.json import to_dict

REPO = Path(__file__).resolve().parents[3]
TRACES = REPO / "tests/data/traces"


def lat(mn, p50, p99, mx, mean):
    return {"min_ns": mn, "p50_ns": p50, "p99_ns": p99, "max_ns": mx, "mean_ns": mean}


def no_hist(rows):
    return [{k: v for k, v in r.items() if k != "hist"} for r in rows]


def test_intel_5_15_trace() -> None:
    d = to_dict(summarize_file(TRACES / "intel-5.15-trace.txt"))
    assert d["total_exits"] == 14
    assert no_hist(d["exits"]) == [
        # MSR_WRITE latencies 2,3,1,4 us -> sorted 1,2,3,4; p50 rank 2, p99 rank ceil(3.96)=4
        {"reason": "MSR_WRITE", "count": 4, "pct": 28.57, **lat(1000, 2000, 4000, 4000, 2500.0)},
        {"reason": "EPT_MISCONFIG", "count": 2, "pct": 14.29, **lat(5000, 5000, 40000, 40000, 22500.0)},
        # the second EXTERNAL_INTERRUPT ends the trace without kvm_entry: counted, no latency
        {"reason": "EXTERNAL_INTERRUPT", "count": 2, "pct": 14.29, **lat(1000, 1000, 1000, 1000, 1000.0)},
        {"reason": "IO_INSTRUCTION", "count": 2, "pct": 14.29, **lat(20000, 20000, 30000, 30000, 25000.0)},
        {"reason": "EPT_VIOLATION", "count": 1, "pct": 7.14, **lat(10000, 10000, 10000, 10000, 10000.0)},
        {"reason": "HLT", "count": 1, "pct": 7.14, **lat(1000000, 1000000, 1000000, 1000000, 1000000.0)},
        {"reason": "MSR_READ", "count": 1, "pct": 7.14, **lat(2000, 2000, 2000, 2000, 2000.0)},
        {"reason": "UNKNOWN(0x4e)", "count": 1, "pct": 7.14, **lat(1000, 1000, 1000, 1000, 1000.0)},
    ]
    assert d["exits"][0]["hist"] == [{"lo_ns": 512, "hi_ns": 1023, "count": 1},
                                     {"lo_ns": 1024, "hi_ns": 2047, "count": 1},
                                     {"lo_ns": 2048, "hi_ns": 4095, "count": 2}]
    assert d["msr"] == [
        {"msr": "0x6e0", "dir": "W", "name": "IA32_TSC_DEADLINE", "count": 3, **lat(2000, 3000, 4000, 4000, 3000.0)},
        {"msr": "0x1b", "dir": "R", "name": "IA32_APIC_BASE", "count": 1, **lat(2000, 2000, 2000, 2000, 2000.0)},
        {"msr": "0x830", "dir": "W", "name": "X2APIC_ICR", "count": 1, **lat(1000, 1000, 1000, 1000, 1000.0)},
    ]
    assert d["pio"] == [{"port": "0x608", "dir": "IN", "count": 2, **lat(20000, 20000, 30000, 30000, 25000.0)}]
    assert d["mmio"] == [
        {"gpa": "0xfe003000", "dir": "W", "count": 1, **lat(5000, 5000, 5000, 5000, 5000.0)},
        {"gpa": "0xfebf1000", "dir": "W", "count": 1, **lat(40000, 40000, 40000, 40000, 40000.0)},
    ]
    assert d["vcpus"] == [{"tid": 4101, "vcpu": 0, "vm": None, "count": 9, "events": 28},
                          {"tid": 4102, "vcpu": 1, "vm": None, "count": 5, "events": 11}]
    assert d["userspace_exits"] == [{"reason": "IO", "count": 2}, {"reason": "MMIO", "count": 1}]
    assert d["unpaired_exits"] == 1


def test_intel_4_19_trace_pipe() -> None:
    d = to_dict(summarize_file(TRACES / "intel-4.19-trace_pipe.txt"))
    assert d["total_exits"] == 8
    # IO 15,12,8,14 us -> 8,12,14,15: p50 rank 2 = 12, p99 rank 4 = 15, mean 49/4
    assert no_hist(d["exits"])[0] == {"reason": "IO_INSTRUCTION", "count": 4, "pct": 50.0,
                                      **lat(8000, 12000, 15000, 15000, 12250.0)}
    assert [(r["reason"], r["count"], r["max_ns"]) for r in d["exits"][1:]] == [
        ("EPT_VIOLATION", 1, 3000), ("HLT", 1, 400000), ("MSR_WRITE", 1, 1000), ("PAUSE_INSTRUCTION", 1, 1000)]
    assert d["pio"] == [
        # 0x608 reads 15,12,14 us (two vCPUs) -> 12,14,15; mean 41/3 us
        {"port": "0x608", "dir": "IN", "count": 3, **lat(12000, 14000, 15000, 15000, 13666.7)},
        {"port": "0x70", "dir": "OUT", "count": 1, **lat(8000, 8000, 8000, 8000, 8000.0)},
    ]
    assert d["msr"] == [{"msr": "0x80b", "dir": "W", "name": "X2APIC_EOI", "count": 1,
                         **lat(1000, 1000, 1000, 1000, 1000.0)}]
    assert [(v["tid"], v["vcpu"], v["count"]) for v in d["vcpus"]] == [(2301, 0, 6), (2302, 1, 2)]
    assert d["unpaired_exits"] == 0


def test_amd_trace() -> None:
    d = to_dict(summarize_file(TRACES / "amd-6.1-trace.txt"))
    assert d["total_exits"] == 8
    assert [(r["reason"], r["count"], r["pct"], r["p50_ns"], r["mean_ns"]) for r in d["exits"]] == [
        ("msr", 3, 37.5, 2000, 3000.0), ("UNKNOWN(0x4ff)", 1, 12.5, 3000, 3000.0),
        ("hlt", 1, 12.5, 500000, 500000.0), ("interrupt", 1, 12.5, 1000, 1000.0),
        ("io", 1, 12.5, 30000, 30000.0), ("npf", 1, 12.5, 50000, 50000.0)]
    assert d["msr"] == [
        {"msr": "0x6e0", "dir": "W", "name": "IA32_TSC_DEADLINE", "count": 2, **lat(2000, 2000, 6000, 6000, 4000.0)},
        {"msr": "0xc0010200", "dir": "W", "name": "AMD_F15H_PERF_CTL0", "count": 1, **lat(1000, 1000, 1000, 1000, 1000.0)},
    ]
    # one userspace MMIO read: "unsatisfied-read" then "read" is one access, 50 us
    assert d["mmio"] == [{"gpa": "0xfebd1000", "dir": "R", "count": 1, **lat(50000, 50000, 50000, 50000, 50000.0)}]
    assert d["pio"] == [{"port": "0x3f8", "dir": "OUT", "count": 1, **lat(30000, 30000, 30000, 30000, 30000.0)}]


def test_trace_cmd_report_with_ns_timestamps() -> None:
    d = to_dict(summarize_file(TRACES / "intel-6.12-trace-cmd-report.txt"))
    assert d["total_exits"] == 5
    assert no_hist(d["exits"]) == [
        # 1234, 1000, 2500 ns -> 1000, 1234, 2500; mean 4734 / 3 = 1578
        {"reason": "CPUID", "count": 3, "pct": 60.0, **lat(1000, 1234, 2500, 2500, 1578.0)},
        {"reason": "INVALID_STATE FAILED_VMENTRY", "count": 1, "pct": 20.0, **lat(None, None, None, None, None)},
        {"reason": "VMCALL", "count": 1, "pct": 20.0, **lat(3000, 3000, 3000, 3000, 3000.0)},
    ]
    assert d["userspace_exits"] == [{"reason": "FAIL_ENTRY", "count": 1}]
    assert d["unpaired_exits"] == 1


def test_json_schema_keys_are_stable() -> None:
    d = to_dict(summarize_file(TRACES / "intel-5.15-trace.txt"))
    lat_keys = {"min_ns", "p50_ns", "p99_ns", "max_ns", "mean_ns"}
    assert {"total_exits", "exits", "msr", "pio", "mmio", "vcpus"} <= d.keys()
    assert {"reason", "count", "pct"} | lat_keys <= d["exits"][0].keys()
    assert {"msr", "dir", "name", "count"} | lat_keys <= d["msr"][0].keys()
    assert {"port", "dir", "count"} | lat_keys <= d["pio"][0].keys()
    assert {"gpa", "dir", "count"} | lat_keys <= d["mmio"][0].keys()
    assert {"tid", "vcpu", "vm", "count"} <= d["vcpus"][0].keys()


def kvm_utils(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.kvm_utils", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=60)


def test_cli_report_json_csv_table() -> None:
    path = str(TRACES / "intel-4.19-trace_pipe.txt")
    out = kvm_utils("report", "--input", path, "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["pio"][0]["p50_ns"] == 14000
    out = kvm_utils("report", "--input", path, "--format", "csv")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "section,key,dir,name,count,pct,min_ns,p50_ns,p99_ns,max_ns,mean_ns"
    assert "exit,IO_INSTRUCTION,,,4,50.0,8000,12000,15000,15000,12250.0" in lines
    assert "pio,0x608,IN,,3,,12000,14000,15000,15000,13666.7" in lines
    out = kvm_utils("report", "--input", path)
    assert out.returncode == 0, out.stderr
    assert "IO_INSTRUCTION" in out.stdout and "12.25" in out.stdout   # mean in us


def test_cli_report_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    out = kvm_utils("report", "--input", str(tmp_path / "nope.txt"))
    assert out.returncode == 2
    assert "nope.txt" in out.stderr


@pytest.mark.parametrize("argv", [["kvm-utils", "--help"], [sys.executable, "-m", "tools.kvm_utils", "--help"]])
def test_entry_points_show_examples(argv) -> None:
    exe = Path(sys.executable).parent / "kvm-utils"
    if argv[0] == "kvm-utils":
        if not exe.exists():
            pytest.fail(f"console script {exe} missing: run `make venv` (pip install -e .)")
        argv = [str(exe), *argv[1:]]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "examples:" in out.stdout and "kvm-utils exits 10" in out.stdout
