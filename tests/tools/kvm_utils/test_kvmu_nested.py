"""kvm-utils live on a real KVM: nested SVM inside a TCG guest (issue 42).

One guest boot (the session fixture `nested_svm`, tests/tools/kvm_utils/conftest.py) serves
every test here: Debian 6.1 with kvm_amd, kprobes, fentry and BTF under single-threaded TCG.
Each test runs one kvm-utils command inside it around the bench helper's tiny KVM guest
with counts the workload fixes (tools/dev/nested_run.py):
- `pio_out N`: N OUTs to port 0x10 and one to the done port: N + 1 SVM `io` exits;
- `tscdeadline_halt M` with a deadline of 2e7 TSC cycles (~8 ms, far above halt polling's
  200 us): M `hlt` exits, each a vCPU that blocks and is woken by the LAPIC timer; its MSR
  exits are the deadline write and the EOI per operation plus the LAPIC setup's four
  accesses (IA32_APIC_BASE read and write, SVR, LVTT), all intercepted (no AVIC under TCG).
Short version (`make test`, ~75 s of one worker): doctor, `exits` (tracepoint engine),
`exits --engine kprobe` with another VM looping while the probes attach, `latency --engine
kprobe`, `kprobe wakeups`, `diagnose` (hlt-wakeups, memory-faults); HYB_NESTED_LONG=1 adds
`kprobe handling|halts|timers`, `bench` and `exits` on the PIO loop.
"""

from __future__ import annotations

import json
import os
import shlex

import pytest

from tools.kvm_utils.sources.kprobe import NO_REASON

pytestmark = [pytest.mark.nested, pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("nested")]

LONG = os.environ.get("HYB_NESTED_LONG") == "1"
long_only = pytest.mark.skipif(not LONG, reason="HYB_NESTED_LONG=1 runs the long version of the nested tier")
N_OUT = 2000
M_HLT = 40
# Each deadline far enough ahead that the vCPU halts before it passes: with 20M cycles a
# suite run on a saturated machine saw 38 of 40 halts wait (the other two found it passed)
HALT = f"--deadline-cycles 60000000 tscdeadline_halt {M_HLT}"
# the LAPIC setup's MSR accesses, then a deadline write and an EOI per operation
MSR_EXITS = 4 + 2 * M_HLT
# A halted vCPU can be woken by something other than its timer and halt once more for the
# same HLT exit (kvm_vcpu_halt returns on a signal or an unblock request while the vCPU is
# not runnable; vcpu_run then halts it again). CI on 2026-11-29 saw 41 wake-ups for 40 HLT
# exits, in both wake-up views, beside one external interrupt: exits are exact, wake-ups
# are the workload's M plus at most this many from the outer guest
SPARE_WAKEUPS = 3
WAKEUPS = range(M_HLT, M_HLT + SPARE_WAKEUPS + 1)


def around(guest, helper: str, *args: str, background: str | None = None, timeout: float = 150) -> dict:
    """`kvm-utils ARGS` in the nested guest while the helper runs `helper` (nested_run.py)."""
    bg = f" --background {shlex.quote(background)}" if background else ""
    cmd = f"cd /srv && python3 run.py --helper {shlex.quote(helper)}{bg} -- {shlex.join(args)}"
    r = guest.run(cmd, timeout=timeout)
    assert r.rc == 0 and not r.timed_out, (r.rc, r.out[-3000:], r.err[-3000:])
    doc = r.json()
    assert "error" not in doc, doc
    assert doc["rc"] == 0, (doc["stderr"][-3000:], doc["stdout"][-3000:])
    assert "error" not in doc["helper"], doc["helper"]
    doc["result"] = json.loads(doc["stdout"]) if doc["stdout"].strip() else None
    return doc


def reasons(doc: dict) -> dict[str, int]:
    return {r["reason"]: r["count"] for r in doc["exits"]}


def test_doctor_says_kprobes_and_fentry_work_and_names_blind_views(nested_svm) -> None:
    r = nested_svm.run("cd /srv && python3 -m tools.kvm_utils doctor", timeout=90)
    checks = {}
    for line in r.out.splitlines():
        status, _, rest = line.partition("  ")
        name, _, detail = rest.strip().partition("  ")
        checks[name.strip()] = (status.strip(), detail.strip())
    assert checks["vendor"] == ("ok", "amd"), r.out
    assert checks["kprobes"][0] == "ok" and checks["BPF fentry program"][0] == "ok", r.out
    assert checks["kprobe engine"] == ("ok", checks["kprobe engine"][1]) and "uses fentry" in checks["kprobe engine"][1]
    assert checks["kprobe view handling"] == ("ok", "probes svm_handle_exit")
    assert checks["kprobe view wakeups"][0] == "ok" and "sched:sched_waking" in checks["kprobe view wakeups"][1]
    # what SVM has no probe for is named, not silently empty
    assert "blind: not applicable to svm on 6.1: no such probe there (posted-interrupt wake-ups" in \
        checks["kprobe view wakeups"][1]
    assert "(LAPIC timer expiries through the VMX preemption timer)" in checks["kprobe view timers"][1]


def test_exits_tracepoint_engine_counts_svm_hlt_and_msr_exits(nested_svm) -> None:
    """The SVM exit table live: kvm_exit's codes 0x78 (hlt) and 0x7c (msr) from a real SVM."""
    doc = around(nested_svm, HALT, "exits", "-p", "{pid}", "--format", "json")
    d = doc["result"]
    assert d["vendor"] == "amd", d
    got = reasons(d)
    assert got["hlt"] == M_HLT, got
    assert got["msr"] == MSR_EXITS, got
    assert d["vcpus"] and d["vcpus"][0]["vm"] == "quiet", d["vcpus"]


def test_exits_kprobe_engine_exact_while_another_vm_loops_during_attach(nested_svm) -> None:
    """Attach order (issue 42, item 6): a second VM exits all the time while bpftrace attaches
    the handler probe and the kvm_exit tracepoint; no exit may come out "reason unknown", and
    the quiet VM's N + 1 `io` exits are counted exactly at svm_handle_exit."""
    doc = around(nested_svm, f"pio_out {N_OUT}", "exits", "--engine", "kprobe", "--format", "json",
                 background="pio_out 4000000000")
    d = doc["result"]
    got = reasons(d)
    assert NO_REASON not in got, got
    # once, beside a busy CPU, no io exit at all came out (not understood: the whole
    # document and kvm-utils' stderr are in the message for the next time)
    assert got.get("io", 0) > N_OUT, (got, d["vcpus"], doc["helper"], doc["attach_s"], doc["stderr"][-2000:])
    # per thread the document has totals only: the quiet VM's N + 1 io exits plus the few
    # interrupt exits of a vCPU that shares the CPU with a looping one (7 in one run); its
    # exact io count is the next test's
    quiet = [v["count"] for v in d["vcpus"] if v["vm"] == "quiet"]
    assert len(quiet) == 1 and N_OUT + 1 <= quiet[0] <= N_OUT + 1 + 40, d["vcpus"]
    assert any(v["vm"] == "busy" and v["count"] > 0 for v in d["vcpus"]), d["vcpus"]


def test_latency_kprobe_engine_times_every_io_exit(nested_svm) -> None:
    """`latency --engine kprobe`: svm_handle_exit timed per reason; every one of the N + 1 io
    exits (reason read at the handler's return: SVM on 6.1 fires kvm_exit inside it)."""
    d = around(nested_svm, f"pio_out {N_OUT}", "latency", "--engine", "kprobe", "-p", "{pid}",
               "--format", "json")["result"]
    io = {r["reason"]: r for r in d["exits"]}["io"]
    assert io["count"] == N_OUT + 1, d
    assert 0 < io["min_ns"] <= io["p50_ns"] <= io["p99_ns"] <= io["max_ns"], io


def test_kprobe_wakeups_sees_every_timer_wake_up_though_wake_up_is_inlined(nested_svm) -> None:
    """M halts, each woken by the LAPIC timer: woke_halted sums to M and the slept hist holds M,
    though Debian's 6.1 inlines kvm_vcpu_wake_up into kvm_vcpu_kick (the old view showed none);
    the never-hit symbol is named under `blind`."""
    doc = around(nested_svm, HALT, "kprobe", "wakeups", "-p", "{pid}", "--format", "json")
    d = doc["result"]
    assert sum(r["count"] for r in d["woke_halted"]) in WAKEUPS, d
    assert sum(b["count"] for b in d["halted_ns_hist"]) in WAKEUPS, d["halted_ns_hist"]
    assert d["halts_unslept"] == [], d
    assert sum(r["count"] for r in d["kicks"]) >= M_HLT, d["kicks"]
    # this kernel: the symbol is in kallsyms and BTF, yet never fires; the engine says so
    assert d["wake_up_calls"] == [] and d["blind"][0].startswith("kvm_vcpu_wake_up never fired while "), d


def test_diagnose_hlt_wakeups_and_memory_faults_live(nested_svm) -> None:
    """The two rules that need kvm_exit, recordings-only on PVM, from a real SVM: thresholds
    lowered so the workload's M halts and its first-touch nested page faults fire them. The
    loop touches four guest pages (page 0: IVT and flags, 0x1000 its code, 0x7000 its stack,
    0x10000 its first sample), each one NPF on a fresh VM (its 128 KiB mapping has no huge page)."""
    doc = around(nested_svm, HALT, "diagnose", "--vm", "quiet", "--threshold", "hlt_per_s=0.1",
                 "--threshold", "mem_faults_per_s=0.1", "--threshold", "min_count=1", "--format", "json")
    d = doc["result"]
    found = {f["rule"]: f for f in d["findings"] if f["vm"] == "quiet"}
    assert set(found) >= {"hlt-wakeups", "memory-faults"}, d
    got = found["hlt-wakeups"]["data"]["vcpus"]["0"]
    # the workload fixes the halts; their wake-ups are its timer's plus a spare one now and
    # then (SPARE_WAKEUPS), as an external interrupt of the outer guest's own may land on the
    # vCPU. Those come with the run's length, not the halts (1 in a full suite run; 4 in
    # 2.5 s on a slow machine, 1.6/s): far fewer than one a halt is what says the timer
    # woke them
    assert got["hlt"] == M_HLT and got["wakeups"] in WAKEUPS and got["external_interrupts"] <= M_HLT // 4, \
        found["hlt-wakeups"]
    assert found["memory-faults"]["data"]["faults"] == 4, found["memory-faults"]
    assert all(n["rule"] not in ("hlt-wakeups", "memory-faults") for n in d["not_evaluated"]), d["not_evaluated"]


@long_only
def test_kprobe_handling_counts_every_exit_the_handler_sees(nested_svm) -> None:
    d = around(nested_svm, HALT, "kprobe", "handling", "-p", "{pid}", "--format", "json")["result"]
    got = reasons(d)
    assert got["hlt"] == M_HLT and got["msr"] == MSR_EXITS and got["npf"] == 4, got
    assert NO_REASON not in got


@long_only
def test_bench_runs_every_case_on_svm(nested_svm) -> None:
    """Under TCG the cycles are the emulator's, not a hardware cost; what is checked is that
    every case runs on SVM and counts its userspace exits right (1 per iteration for the
    `*_user` cases, none for the in-kernel ones)."""
    r = nested_svm.run("cd /srv && python3 -m tools.kvm_utils bench --json --repeat 1 --target-cycles 4194304",
                       timeout=300)
    assert r.rc == 0, r.err[-3000:]
    rows = {x["name"]: x for x in json.loads(r.out)}
    from tools.kvm_utils.bench import TESTS
    assert set(TESTS) <= set(rows), sorted(rows)
    for name in TESTS:
        assert rows[name]["error"] is None, rows[name]
        assert rows[name]["userspace_exits_per_iter"] == (1.0 if name.endswith("_user") else 0.0), rows[name]


@long_only
def test_exits_tracepoint_engine_counts_svm_io_exits(nested_svm) -> None:
    d = around(nested_svm, f"pio_out {N_OUT}", "exits", "-p", "{pid}", "--format", "json")["result"]
    assert reasons(d)["io"] == N_OUT + 1, d


@long_only
def test_kprobe_halts_and_timers_count_the_workload(nested_svm) -> None:
    h = around(nested_svm, HALT, "kprobe", "halts", "-p", "{pid}", "--format", "json")["result"]
    # kvm_vcpu_halt calls: one per HLT exit, and another for a halt woken spuriously
    assert len(h["halts"]) == 1 and h["halts"][0]["count"] in WAKEUPS, h
    assert sum(b["count"] for b in h["halt_ns_hist"]) in WAKEUPS, h["halt_ns_hist"]
    t = around(nested_svm, HALT, "kprobe", "timers", "-p", "{pid}", "--format", "json")["result"]
    assert [r["count"] for r in t["tsc_deadline_wrmsr"]] == [M_HLT], t
    assert sum(r["count"] for r in t["apic_timer_fn"]) >= M_HLT, t


@long_only
def test_record_then_report_reads_the_svm_exits_back(nested_svm) -> None:
    """`record` (raw kvm events from a private ftrace instance) around the halting workload,
    then `report` on the file: the SVM table names the codes read back, exact counts."""
    doc = around(nested_svm, HALT, "record", "-o", "/tmp/nested.rec")
    assert "Recording kvm events to /tmp/nested.rec" in doc["stderr"], doc["stderr"][-2000:]
    r = nested_svm.run("cd /srv && python3 -m tools.kvm_utils report -i /tmp/nested.rec --format json", timeout=90)
    assert r.rc == 0, r.err[-3000:]
    d = json.loads(r.out)
    got = reasons(d)
    assert got["hlt"] == M_HLT and got["msr"] == MSR_EXITS, got
