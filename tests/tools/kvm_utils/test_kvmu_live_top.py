"""Live: `kvm-utils top --once` (non-interactive: one frame) counts the tiny guest exactly.

The guest is created first and waits on stdin; top says when its counters are open; then
the guest runs 3000 userspace PIO writes (+1 for its done port) inside top's interval.
"""

from __future__ import annotations

import pytest

from kvmu_helpers import attach_and_run
from tools.kvm_utils.bench import helper_argv

pytestmark = [pytest.mark.root, pytest.mark.integration]


def test_top_once_prints_one_frame(helper, kvm_events) -> None:
    if "kvm_pio" not in kvm_events:
        pytest.skip("kvm_pio tracepoint missing")
    g, res, top, out, err = attach_and_run(
        helper_argv("pio_out", 3000, name="kvmu-top", wait_stdin=True),
        ["top", "--once", "-i", "6", "-g", "kvmu-top", "--sort", "total"], "counting 1 vCPU threads", 60)
    assert res["userspace_exits"] == {"IO": 3000}
    assert top.returncode == 0, err
    assert "\x1b[" not in out and out.count("kvm-utils top") == 1          # one plain frame
    assert "sort: total" in out and "scope threads" in out
    vm_line = next(ln for ln in out.splitlines() if ln.strip().startswith("kvmu-top"))
    assert "6,002" in vm_line and f"pid {g.pid}, 1 vCPU thread(s)" in vm_line   # kvm_pio + IO exits
    pio_line = next(ln for ln in out.splitlines() if ln.split()[:2] == ["event", "kvm_pio"])
    assert pio_line.split()[-1] == "3,001"
    user_line = next(ln for ln in out.splitlines() if ln.split()[:2] == ["user", "ALL"])    # one counter
    assert user_line.split()[-1] == "3,001"


def test_top_once_bpf_engine(helper, kvm_events) -> None:
    """The same frame from the BPF engine: userspace exits split by reason at no extra cost."""
    import shutil
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace not installed")
    g, res, top, out, err = attach_and_run(
        helper_argv("pio_out", 3000, name="kvmu-topbpf", wait_stdin=True),
        ["top", "--once", "--engine", "bpf", "-i", "6", "-g", "kvmu-topbpf", "--sort", "total"],
        "in one BPF program", 60)
    assert res["userspace_exits"] == {"IO": 3000}
    assert top.returncode == 0, err
    vm_line = next(ln for ln in out.splitlines() if ln.strip().startswith("kvmu-topbpf"))
    assert "6,002" in vm_line and f"pid {g.pid}, 1 vCPU thread(s)" in vm_line
    assert next(ln for ln in out.splitlines() if ln.split()[:2] == ["user", "IO"]).split()[-1] == "3,001"
