"""Live: the tools stop on SIGTERM as on Ctrl-C, also when started the way a shell starts a
background job (`make test &` in a script: SIGINT ignored, and an ignored signal stays
ignored in every child): the summary is printed, the ftrace instance removed, bpftrace
stopped after printing its maps (the exact counts below only exist if it printed them).

They catch SIGINT even when it was ignored at start, as perf and bpftrace do, so `kill
-INT` stops a background kvm-utils too.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from kvmu_helpers import (alive, children, finish, go, instance_dirs, instance_of, kvm_utils_popen, only_pid,
                          sigint_disposition, start_guest, stderr_has, stop, wait_for)
from tools.kvm_utils.bench import helper_argv

pytestmark = [pytest.mark.root, pytest.mark.integration]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_record_started_as_background_job(sig, helper, kvm_events, tracefs_root, tmp_path,
                                          no_leftover_instances) -> None:
    if "kvm_pio" not in kvm_events:
        pytest.skip("kvm_pio tracepoint missing")
    path = tmp_path / "bg.kvmu"
    g = start_guest(helper_argv("pio_out", 5000, name="kvmu-bg-record", wait_stdin=True))
    proc = None
    try:
        proc = kvm_utils_popen("record", "-o", str(path), sigint=signal.SIG_IGN)
        wait_for(lambda: instance_of(tracefs_root, proc.pid) is not None, what="record's ftrace instance")
        assert sigint_disposition(proc.pid) == "caught"        # inherited ignored, caught anyway
        assert go(g)["userspace_exits"] == {"IO": 5000}
        out, err = stop(proc, sig)
    finally:
        if proc is not None and proc.poll() is None:
            stop(proc, signal.SIGKILL)
        finish(g)
    assert proc.returncode == 0, err
    assert "recorded " in err and f"to {path}" in err          # its summary line
    assert instance_dirs(tracefs_root, proc.pid) == []       # tracing off, instance removed
    d = only_pid(path, g.pid)
    assert [(p["port"], p["dir"], p["count"]) for p in d["pio"]] == [("0x10", "OUT", 5000), ("0xf1", "OUT", 1)]
    assert d["vcpus"][0]["vm"] == "kvmu-bg-record"


@pytest.mark.parametrize("tool", ["io", "exits-bpf"])
def test_bpftrace_tools_started_as_background_job_stop_on_sigterm(tool, helper, kvm_events) -> None:
    """`io` (bpf.run_script) and `exits --engine bpf` (live.BpfCounters): the two ways a
    tool runs bpftrace and stops it."""
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace not installed")
    if "kvm_pio" not in kvm_events:
        pytest.skip("kvm_pio tracepoint missing")
    name = f"kvmu-bg-{tool}"
    argv, ready = {"io": (["io", "--format", "json"], "Tracing kvm exits"),
                   "exits-bpf": (["exits", "--engine", "bpf", "-g", name, "-q", "--format", "json"],
                                 "Counting kvm exits in BPF")}[tool]
    g = start_guest(helper_argv("pio_out", 500, name=name, wait_stdin=True))
    proc = None
    kids: list[int] = []
    try:
        proc = kvm_utils_popen(*argv, sigint=signal.SIG_IGN)
        lines: list[str] = []
        wait_for(lambda: stderr_has(proc, lines, ready), timeout=60, what="bpftrace attach")
        assert sigint_disposition(proc.pid) == "caught"
        kids = children(proc.pid)
        assert len(kids) == 1 and "bpftrace" in Path(f"/proc/{kids[0]}/comm").read_text()
        assert go(g)["userspace_exits"] == {"IO": 500}
        out, err = stop(proc, signal.SIGTERM, timeout=60)
    finally:
        if proc is not None and proc.poll() is None:
            stop(proc, signal.SIGKILL)
        finish(g)
    assert proc.returncode == 0, err
    assert not any(alive(k) for k in kids), "bpftrace outlived kvm-utils"
    d = json.loads(out)
    if tool == "io":
        pio = {(p["port"], p["dir"]): p["count"] for p in d["pio"]}
        assert pio[("0x10", "OUT")] == 500
    else:
        assert [(v["tid"], v["vm"], v["vcpu"], v["events"]) for v in d["vcpus"]] == \
            [(g.pid, name, 0, 2 * 501)]                       # kvm_pio + userspace IO, loop + done port
