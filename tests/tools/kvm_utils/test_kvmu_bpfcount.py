"""`exits --engine bpf`: program text, recorded bpftrace records -> counts (pure), engine
choice, and a live run on this host (PVM: kvm_exit never fires, so the exact live
assertions are on userspace exits and kvm_pio; the VMX/SVM reason path is checked on
recorded `bpftrace -f json` records of the same program)."""

from __future__ import annotations

import json
import signal

import pytest

from kvmu_helpers import finish, go, kvm_utils_popen, start_guest, stderr_has, stop, wait_for
from tools.kvm_utils.arch import Vendor
from tools.kvm_utils.bench import helper_argv
from tools.kvm_utils.live import EVENT_COUNTERS, choose_engine
from tools.kvm_utils.sources.bpfcount import Deltas, count_script, parse_record, to_counts

# bpftrace 0.17 -f json, one interval of the counting program: thread 4101 on a VMX host
# (isa 1) with 5 EPT_MISCONFIG (49) and 2 MSR_WRITE (32); thread 4102 on an SVM host (isa 2)
# with 3 hlt (0x78); thread 4101 made 5 userspace MMIO exits (6) and 5 kvm_mmio events.
RECORDED = [
    '{"type": "attached_probes", "data": {"probes": 9}}',
    '{"type": "printf", "data": "kvm-utils-ready\\n"}',
    '{"type": "map", "data": {"@x": {"4101,1,49": 5, "4101,1,32": 2, "4102,2,120": 3, "4101,1,4660": 1}}}',
    '{"type": "map", "data": {"@u": {"4101,6": 5}}}',
    '{"type": "map", "data": {"@ev": {"4101,1": 5}}}',
    '{"type": "printf", "data": "kvm-utils-tick\\n"}',
]


def test_script_one_probe_per_tracepoint_and_pid_guard() -> None:
    s = count_script(["kvm_pio", "kvm_mmio"], 0.5, pids=[42, 7], duration=3)
    assert "tracepoint:kvm:kvm_exit { if (pid != 7 && pid != 42) { return; } @x[tid, args->isa, " \
           "args->exit_reason] = count(); }" in s
    assert "tracepoint:kvm:kvm_mmio { if (pid != 7 && pid != 42) { return; } @ev[tid, 1] = count(); }" in s
    assert "/args->errno >= 0/" in s                  # a failed KVM_RUN is not an exit
    assert "interval:ms:500 {" in s and "interval:ms:100 { if (nsecs - @kvmu_t0 >= 3000000000) { exit(); } }" in s
    assert "filter" not in s and s.count("tracepoint:kvm:kvm_exit") == 1   # no per-reason probes
    assert "pid !=" not in count_script(["kvm_pio"], 1)
    # bpftrace runs print() and clear() later in userspace: clearing lost counts in between
    assert not any(f"clear(@{m})" in s for m in ("x", "u", "ev"))  # the window's start only, in END


def test_cumulative_maps_to_interval_deltas() -> None:
    d = Deltas()
    assert d({"u": {(7, 2): 10}, "ev": {(7, 0): 10}}) == {"u": {(7, 2): 10}, "ev": {(7, 0): 10}}
    assert d({"u": {(7, 2): 25, (8, 2): 1}, "ev": {(7, 0): 10}}) == {"u": {(7, 2): 15, (8, 2): 1}}
    assert d({"u": {(7, 2): 25}}) == {}                  # nothing new; a key not printed keeps its value
    assert d({"u": {(7, 2): 26, (8, 2): 1}}) == {"u": {(7, 2): 1}}


def test_recorded_records_to_named_counts() -> None:
    recs = [parse_record(ln) for ln in RECORDED]
    assert recs[0] is None and recs[1] is None and recs[-1] == "tick"
    maps = dict(r for r in recs if isinstance(r, tuple))
    c = to_counts(maps, ["kvm_pio", "kvm_mmio"], lambda tid: tid, lambda kind, label: (kind, label))
    assert c == {(4101, ("exit", "EPT_MISCONFIG")): 5, (4101, ("exit", "MSR_WRITE")): 2,
                 (4102, ("exit", "hlt")): 3, (4101, ("exit", "UNKNOWN(0x1234)")): 1,
                 (4101, ("user", "MMIO")): 5, (4101, ("event", "kvm_mmio")): 5}


def test_engine_choice() -> None:
    assert choose_engine("auto", Vendor.INTEL, True) == "bpf"
    assert choose_engine("auto", Vendor.AMD, True) == "bpf"
    assert choose_engine("auto", Vendor.INTEL, False) == "perf"     # no bpftrace: kvm_stat's way
    assert choose_engine("auto", None, True) == "perf"              # silent kvm_exit (PVM): 2 counters suffice
    assert choose_engine("perf", Vendor.INTEL, True) == "perf"


@pytest.mark.root
@pytest.mark.integration
def test_live_bpf_engine_counts_exactly_per_vcpu(helper, kvm_events) -> None:
    import shutil
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace not installed")
    # 100,000 exits over several 0.25 s flushes of the program: an interval lost or counted
    # twice between flushes would show (print+clear did: 226,441 of 200,000)
    g = start_guest(helper_argv("pio_out", 100_000, name="kvmu-bpfcount", wait_stdin=True))
    proc = None
    try:
        proc = kvm_utils_popen("exits", "--engine", "bpf", "-g", "kvmu-bpfcount", "-i", "0.3", "--format", "json")
        lines: list[str] = []
        wait_for(lambda: stderr_has(proc, lines, "Counting kvm exits in BPF"), timeout=60, what="bpftrace attach")
        assert go(g)["userspace_exits"] == {"IO": 100_000}
        other = json.loads(__import__("subprocess").run(helper_argv("pio_out", 50), capture_output=True,
                                                        text=True, timeout=60).stdout)
        assert other["userspace_exits"] == {"IO": 50}          # another VM: the -g guard leaves it out
        out, err = stop(proc, signal.SIGINT, timeout=60)
    finally:
        if proc is not None and proc.poll() is None:
            stop(proc, signal.SIGKILL)
        finish(g)
    assert proc.returncode == 0, err
    d = json.loads(out)
    assert d["mode"] == "bpf-counting"
    assert {r["reason"]: r["count"] for r in d["userspace_exits"]} == {"IO": 100_001}     # loop + done port
    assert {r["event"]: r["count"] for r in d["events"]}["kvm_pio"] == 100_001
    assert [(v["tid"], v["vm"], v["vcpu"], v["events"]) for v in d["vcpus"]] == \
        [(g.pid, "kvmu-bpfcount", 0, 200_002)]


def test_event_index_order_is_the_perf_engines() -> None:
    """Both engines count the same tracepoints; @ev's index is the position in this list."""
    assert list(EVENT_COUNTERS[:2]) == ["kvm_pio", "kvm_mmio"]
