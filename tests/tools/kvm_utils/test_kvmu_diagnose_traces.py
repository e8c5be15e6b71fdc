"""`diagnose --input` on the recorded `diag-*` traces of tests/data/traces/.

They are representative recordings written to the kernel's exact print formats by
tests/data/traces/make_diagnose_traces.py (not live captures: this host's PVM /dev/kvm
never emits kvm_exit); each rate below is worked out from the timestamps in its docstring.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.kvm_utils.diagnose.rules import diagnose
from tools.kvm_utils.diagnose.run import evidence_from_file

REPO = Path(__file__).resolve().parents[3]
TRACES = REPO / "tests/data/traces"


def run(name: str, vm: str | None = None) -> dict:
    return diagnose(evidence_from_file(TRACES / name), vm=vm).to_dict()


def only(d: dict) -> dict:
    assert len(d["findings"]) == 1, [f["rule"] for f in d["findings"]]
    return d["findings"][0]


def test_traces_are_reproducible() -> None:
    r = subprocess.run([sys.executable, str(TRACES / "make_diagnose_traces.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_acpi_pm_clocksource() -> None:
    d = run("diag-acpi-pm-intel-5.15-trace.txt")
    f = only(d)
    assert f["rule"] == "clocksource" and f["data"]["clocksource"] == "acpi_pm"
    # 200 reads from 4000.000000 to 4000.009960 (last entry of vCPU 1's 100th read)
    assert f["data"]["reads"] == 200 and f["data"]["ports"] == {"0x608": 200}
    assert f["data"]["rate_per_s"] == pytest.approx(200 / 0.00996, abs=0.1)
    assert "PIO IN port 0x608" in f["evidence"][0]
    assert "clocksource=tsc tsc=reliable" in f["advice"]
    assert "profile `online`" in f["fix"] and "[clock]" in f["fix"]


def test_tsc_deadline_storm_from_msr_only_recording() -> None:
    d = run("diag-tsc-deadline-intel-5.15-msr-only.txt")
    f = only(d)
    assert f["rule"] == "tsc-deadline-storm"
    assert f["data"]["writes"] == 600
    assert f["data"]["rate_per_s"] == pytest.approx(600 / 0.003743, abs=0.1)     # > 100k/s
    assert f["data"]["per_vcpu"] == {"0": 150, "1": 150, "2": 150, "3": 150}
    assert "BBR" in f["advice"] and "0x6e0" in f["evidence"][0]
    # only kvm_msr was recorded: the rules that need kvm_exit say so instead of passing silently
    assert {n["rule"] for n in d["not_evaluated"]} == {"hlt-wakeups", "memory-faults"}


def test_vpmu_sampling_periodic() -> None:
    f = only(run("diag-vpmu-intel-5.15-trace.txt"))
    assert f["rule"] == "vpmu-sampling"
    assert f["data"]["msrs"] == {"0x38f/W": 12, "0xc1/W": 6, "0x186/W": 6, "0x38d/W": 6}
    assert f["data"]["rdpmc_exits"] == 12 and f["data"]["accesses"] == 42
    assert f["data"]["bursts"] == 3 and f["data"]["period_s"] == 1.0
    assert "perfevents disable" in f["advice"] and '[atop] perfevents = "disable"' in f["fix"]


def test_hlt_wakeups_on_irq_vcpu_only() -> None:
    f = only(run("diag-hlt-intel-4.19-trace_pipe.txt"))
    assert f["rule"] == "hlt-wakeups"
    # vCPU 0: 100 HLT + 100 wake-ups; the window is 4000.000000 .. 4000.019962
    assert f["data"]["vcpus"] == {"0": {"hlt": 100, "wakeups": 100, "external_interrupts": 0}}
    assert f["data"]["spread_over_all_vcpus"] is False
    assert "nohlt_list=0" in f["advice"] and "cpuidle-haltpoll" in f["advice"]
    assert '[idle] poll = "irq-vcpus"' in f["fix"] and "irqaffinity" not in f["fix"]


def test_ipi_storm_from_record_file_with_vm_names() -> None:
    d = run("diag-ipi-intel-6.1.kvmu")
    assert d["source"] == "record diag-ipi-intel-6.1.kvmu" and d["duration_s"] == 0.012   # header's 0.011941
    assert [v["vm"] for v in d["vms"]] == ["web1"]
    f = only(d)
    assert f["rule"] == "ipi-storm" and f["vm"] == "web1"
    assert f["data"]["writes"] == 200 and f["data"]["vectors"] == {"0xfc": 180, "0xfd": 20}
    assert "TLB shootdowns" in f["advice"] and "jemalloc" in f["advice"]
    assert "MALLOC_CONF" in f["fix"] and "online-nodecay" in f["fix"]
    assert run("diag-ipi-intel-6.1.kvmu", vm="db2")["findings"] == []


def test_npf_ram_faults_exclude_mmio() -> None:
    f = only(run("diag-npf-amd-6.1-trace.txt"))
    assert f["rule"] == "memory-faults"
    assert f["data"]["faults"] == 200            # 220 npf exits, 20 of them carried kvm_mmio
    assert "hugepages" in f["title"] and "memoryBacking" in f["fix"]


def test_clean_trace_yields_no_advice() -> None:
    d = run("diag-clean-intel-5.15-trace.txt")
    assert d["findings"] == [] and d["not_evaluated"] == []
    assert d["vms"][0]["exits"] == 144


def test_cli_json_and_table() -> None:
    cmd = [sys.executable, "-m", "tools.kvm_utils", "diagnose", "--input"]
    r = subprocess.run(cmd + [str(TRACES / "diag-acpi-pm-intel-5.15-trace.txt"), "--format", "json"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) == {"duration_s", "source", "vms", "findings", "not_evaluated", "thresholds", "lost_events"}
    assert set(d["findings"][0]) == {"rule", "vm", "title", "evidence", "advice", "fix", "data", "severity"}
    r = subprocess.run(cmd + [str(TRACES / "diag-clean-intel-5.15-trace.txt")], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert r.returncode == 0 and "no known pathology found" in r.stdout
    r = subprocess.run(cmd + [str(TRACES / "nope.txt")], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2 and "nope.txt" in r.stderr
