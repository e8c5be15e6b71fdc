"""Live: `kvm-utils diagnose` flags the acpi_pm clocksource rule on the bench helper's tiny
guest reading port 0x608 (the q35 ACPI PM timer), as a guest on acpi_pm does per clock read.

On this host (PVM) kvm_exit never fires, but kvm_pio does: the rule needs only kvm_pio.
Readiness, not sleeps: the guest waits on stdin until diagnose says it is attached.
"""

from __future__ import annotations

import json

import pytest

from kvmu_helpers import attach_and_run
from tools.kvm_utils.bench import helper_argv

pytestmark = [pytest.mark.root, pytest.mark.integration]


@pytest.mark.parametrize("engine", ["bpf", "ftrace"])
def test_diagnose_flags_acpi_pm_reads(helper, kvm_events, no_leftover_instances, engine) -> None:
    if "kvm_pio" not in kvm_events:
        pytest.skip("kvm_pio tracepoint missing")
    _g, res, diag, out, err = attach_and_run(
        helper_argv("pio_in_port", 5000, name="kvmu-diag", port=0x608, wait_stdin=True),
        ["diagnose", "--engine", engine, "--vm", "kvmu-diag", "--format", "json", "6"], "Diagnosing", 120)
    assert res["userspace_exits"] == {"IO": 5000}
    assert diag.returncode == 0, err
    d = json.loads(out)
    assert [v["vm"] for v in d["vms"]] == ["kvmu-diag"]
    assert [f["rule"] for f in d["findings"]] == ["clocksource"]
    f = d["findings"][0]
    assert f["vm"] == "kvmu-diag" and f["data"]["ports"] == {"0x608": 5000}   # exact: every read
    assert f["data"]["rate_per_s"] > 10 and "clocksource=tsc tsc=reliable" in f["advice"]
    assert 5.0 < d["duration_s"] < 30
