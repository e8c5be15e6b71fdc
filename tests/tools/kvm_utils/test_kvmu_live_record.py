"""Live: `record` + `report` see exactly the exits the tiny KVM guest makes on this host.

This host's /dev/kvm is a software hypervisor (PVM): it emits kvm_pio, kvm_msr, kvm_mmio
and kvm_userspace_exit but no kvm_exit/kvm_entry, so exit *reasons* and latencies are
checked on recorded traces (test_kvmu_report.py) and here only where the kernel emits them.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from kvmu_helpers import REPO, instance_dirs, instance_of, kvm_utils_popen, only_pid, stop, wait_for

pytestmark = [pytest.mark.root, pytest.mark.integration]


def guest(helper, mode: str, n: int, name: str = "kvmu-test") -> dict:
    out = subprocess.run([str(helper), "-name", f"guest={name},debug-threads=on", "--linger-ms", "300",
                          mode, str(n)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def record_while(tracefs_root, tmp_path, runs):
    """Start `kvm-utils record`, run the guests once tracing is on, stop with SIGINT."""
    path = tmp_path / "run.kvmu"
    proc = kvm_utils_popen("record", "-o", str(path))
    try:
        wait_for(lambda: instance_of(tracefs_root, proc.pid) is not None, what="record's ftrace instance")
        results = [guest(*r) for r in runs]
    finally:
        _, err = stop(proc, signal.SIGINT)
    assert proc.returncode == 0, err
    assert instance_dirs(tracefs_root, proc.pid) == []
    return path, results


def test_record_counts_pio_msr_mmio_exactly(helper, kvm_events, tracefs_root, tmp_path, no_leftover_instances):
    for needed in ("kvm_pio", "kvm_msr", "kvm_mmio", "kvm_userspace_exit"):
        if needed not in kvm_events:
            pytest.skip(f"tracepoint kvm:{needed} missing on this kernel")
    path, (pio, msr, mmio, kpio) = record_while(tracefs_root, tmp_path, [
        (helper, "pio_out", 250), (helper, "rdmsr", 40), (helper, "mmio_read", 30),
        (helper, "pio_kernel", 20)])
    assert pio["userspace_exits"] == {"IO": 250}          # the helper's own view
    d = only_pid(path, pio["pid"])
    assert d["pio"] == [{"port": "0x10", "dir": "OUT", "count": 250, "min_ns": None, "p50_ns": None,
                         "p99_ns": None, "max_ns": None, "mean_ns": None},
                        {"port": "0xf1", "dir": "OUT", "count": 1, "min_ns": None, "p50_ns": None,
                         "p99_ns": None, "max_ns": None, "mean_ns": None}]
    assert d["userspace_exits"] == [{"reason": "IO", "count": 251}]   # + the done port
    assert d["vcpus"][0]["vm"] == "kvmu-test" and d["vcpus"][0]["vcpu"] == 0

    d = only_pid(path, msr["pid"])
    assert [(m["msr"], m["dir"], m["name"], m["count"]) for m in d["msr"]] == [("0x10", "R", "IA32_TSC", 40)]
    assert d["userspace_exits"] == [{"reason": "IO", "count": 1}]     # RDMSR stays in the kernel

    d = only_pid(path, mmio["pid"])
    assert [(m["gpa"], m["dir"], m["count"]) for m in d["mmio"]] == [("0x20000", "R", 30)]
    assert {r["reason"]: r["count"] for r in d["userspace_exits"]} == {"MMIO": 30, "IO": 1}

    d = only_pid(path, kpio["pid"])   # PIC port 0x21 is handled by the in-kernel irqchip
    assert [(p["port"], p["dir"], p["count"]) for p in d["pio"]] == [("0x21", "IN", 20), ("0xf1", "OUT", 1)]
    assert d["userspace_exits"] == [{"reason": "IO", "count": 1}]


def test_record_with_duration_stops_by_itself(helper, kvm_events, tmp_path, no_leftover_instances):
    path = tmp_path / "d.kvmu"
    out = subprocess.run([sys.executable, "-m", "tools.kvm_utils", "record", "-o", str(path), "0.5"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    header = json.loads(path.read_text().splitlines()[0].removeprefix("# kvm-utils-record "))
    assert 0.5 <= header["duration_s"] < 5
    assert header["version"] == 1
