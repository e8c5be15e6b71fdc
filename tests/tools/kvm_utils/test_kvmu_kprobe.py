"""The kprobe engine (sources/kprobe.py): program text per vendor, kernel and bpftrace version,
the parser on bpftrace's text output, the summaries, `auto`'s choice; and a live run that is
skipped, with doctor's reason, where neither kprobes nor fentry attach (this machine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from kvmu_helpers import REPO
from tools.kvm_utils import kprobe_table
from tools.kvm_utils.render import render_view
from tools.kvm_utils.render.json import to_dict
from tools.kvm_utils.sources import kprobe
from tools.kvm_utils.sources.bpftrace_output import parse
from tools.kvm_utils.sources.kprobe import (NO_REASON, KprobeUnavailable, auto_picks_kprobe, make_plan, program,
                                            style_for, view_summary)

EVERY = frozenset(c.symbol for p in kprobe_table.TABLE for c in p.candidates)


def _plan(view: str, vendor: str, kernel: tuple[int, int], kind: str = "kprobe",
          bt: tuple[int, int, int] = (0, 17, 0), drop: frozenset[str] = frozenset()):
    res = kprobe_table.resolve(kernel, vendor, EVERY - drop)
    return make_plan(view, res, style_for(kind, bt))


# ---- program generation ----------------------------------------------------------------

def test_handling_program_vmx_kprobe_exact() -> None:
    text = program(_plan("handling", "vmx", (6, 1)), 2.5, pids=[42])
    assert text.startswith('BEGIN { @kvmu_t0 = nsecs; printf("kvm-utils-ready\\n"); }\n'
                           "tracepoint:kvm:kvm_exit { @reason[tid] = args->exit_reason; @isa[tid] = args->isa; }\n"
                           "kprobe:vmx_handle_exit { if (pid != 42) { return; } @hs[tid] = nsecs; }\n"
                           "kretprobe:vmx_handle_exit /@hs[tid] && @isa[tid]/ {\n")
    assert "@e_ll[$i, $r, $k] = count(); @t_n[tid] = count(); @x[tid, $i, $r] = count();" in text
    assert text.endswith("interval:ms:100 { if (nsecs - @kvmu_t0 >= 2500000000) { exit(); } }\n"
                         "END { clear(@hs); clear(@reason); clear(@isa); clear(@kvmu_t0); }\n")


@pytest.mark.parametrize("vendor,symbol", [("vmx", "vmx_handle_exit"), ("svm", "svm_handle_exit"),
                                           ("pvm", "pvm_handle_exit")])
def test_handling_attaches_the_vendors_handler(vendor, symbol) -> None:
    text = program(_plan("handling", vendor, (6, 18)), None)
    assert f"kprobe:{symbol} {{" in text and f"kretprobe:{symbol} /@hs[tid]" in text
    assert [h for h in ("vmx_handle_exit", "svm_handle_exit", "pvm_handle_exit") if h in text] == [symbol]
    assert "interval" not in text


@pytest.mark.parametrize("vendor,guard", [("vmx", True), ("svm", True), ("pvm", False)])
def test_handling_counts_only_exits_whose_kvm_exit_was_seen(vendor, guard) -> None:
    """Attach order (issue 42): with a guest running while bpftrace attaches, the handler probe
    could be in place before kvm_exit's, and 3-5 % of exits came out "reason unknown" on
    nested SVM. On VMX/SVM the handler's return now needs this thread's kvm_exit (@isa is 1
    or 2 once it fired); at the return, not the entry, because SVM on Debian's 6.1 fires
    kvm_exit inside svm_handle_exit (an entry guard dropped every other exit there, measured
    in the nested guest: 1,000 of 2,001). On PVM, where kvm_exit never fires, all count."""
    plan = _plan("handling", vendor, (6, 1))
    sym = plan.symbols["exit handler entry to return"]
    text = program(plan, None)
    assert f"kprobe:{sym} {{ @hs[tid] = nsecs; }}" in text
    assert (f"kretprobe:{sym} /@hs[tid] && @isa[tid]/ {{" in text) is guard
    assert (f"kretprobe:{sym} /@hs[tid]/ {{" in text) is not guard
    # the reason and isa are what the tracepoint set: deleted with the exit, never carried on
    assert "delete(@hs[tid]); delete(@reason[tid]); delete(@isa[tid]);" in text


@pytest.mark.parametrize("bt,entry,ret,arg", [((0, 17, 0), "kfunc", "kretfunc", "(uint64)args->vcpu"),
                                              ((0, 20, 2), "fentry", "fexit", "(uint64)args->vcpu"),
                                              ((0, 21, 0), "fentry", "fexit", "(uint64)args.vcpu")])
def test_fentry_spelling_per_bpftrace_version(bt, entry, ret, arg) -> None:
    text = program(_plan("wakeups", "vmx", (6, 1), "fentry", bt), None)
    assert f"{entry}:kvm_vcpu_halt {{ $v = {arg}; @hstart[$v] = nsecs;" in text
    assert f"{ret}:kvm_vcpu_halt /@vof[tid]/" in text
    assert f"{entry}:kvm_vcpu_wake_up {{ $v = {arg};" in text
    assert f"{entry}:pi_wakeup_handler {{ @pi_wake[cpu] = count(); }}" in text


def test_wakeups_kprobe_exact_vmx_6_1() -> None:
    assert program(_plan("wakeups", "vmx", (6, 1)), None, pids=[7]) == (
        'BEGIN { @kvmu_t0 = nsecs; printf("kvm-utils-ready\\n"); }\n'
        "kprobe:kvm_vcpu_halt { if (pid != 7) { return; } $v = arg0; @hstart[$v] = nsecs; @vtid[$v] = tid; "
        "@vof[tid] = $v; @halted[tid] = nsecs; }\n"
        "kretprobe:kvm_vcpu_halt /@vof[tid]/ { if (@halted[tid]) { @unslept[tid] = count(); } "
        "delete(@hstart[@vof[tid]]); delete(@vof[tid]); delete(@halted[tid]); }\n"
        "tracepoint:sched:sched_waking /@halted[args->pid]/ { @woke[tid, args->pid] = count(); "
        "@slept_ns = hist(nsecs - @halted[args->pid]); delete(@halted[args->pid]); }\n"
        "kprobe:kvm_vcpu_wake_up { $v = arg0; if (@vtid[$v] == 0) { return; } @wake_call[tid, @vtid[$v]] = count();\n"
        "  if (@hstart[$v] == 0) { @wake_running[tid, @vtid[$v]] = count(); }\n}\n"
        "kprobe:kvm_vcpu_kick { $v = arg0; if (@vtid[$v] == 0) { return; } @kick[tid, @vtid[$v]] = count(); }\n"
        "kprobe:pi_wakeup_handler { @pi_wake[cpu] = count(); }\n"
        "END { clear(@hstart); clear(@vtid); clear(@vof); clear(@halted); clear(@kvmu_t0); }\n")


def test_wakeups_do_not_depend_on_kvm_vcpu_wake_up_firing() -> None:
    """Issue 42: on Debian's 6.1 kvm.ko kvm_vcpu_wake_up is inlined into kvm_vcpu_kick and
    kvm_make_vcpu_request (kallsyms and BTF still list its out-of-line copy, which kvm_amd
    calls), so the old view, which counted wake-ups at its probe, showed none of ~190/s. Who
    woke a halted vCPU now comes from the scheduler's wake-up of its thread, which every
    path takes, inlined or not; the woke_halted map is written there and nowhere else."""
    text = program(_plan("wakeups", "svm", (6, 1), "fentry"), None)
    woke = [ln for ln in text.splitlines() if "@woke[" in ln]
    assert len(woke) == 1 and woke[0].startswith("tracepoint:sched:sched_waking /@halted[args->pid]/")
    assert "kfunc:kvm_vcpu_halt { $v = (uint64)args->vcpu; @hstart[$v] = nsecs; @vtid[$v] = tid; " in text


def test_version_ranges_pick_the_symbols() -> None:
    old = program(_plan("wakeups", "vmx", (5, 4)), None)
    assert "kprobe:kvm_vcpu_block" in old and "kprobe:wakeup_handler" in old and "pi_wakeup_handler" not in old
    svm = program(_plan("wakeups", "svm", (6, 1)), None)
    assert "pi_wakeup_handler" not in svm and "wakeup_handler" not in svm      # VMX only
    assert "kprobe:kvm_lapic_expired_hv_timer" not in program(_plan("timers", "svm", (6, 1)), None)
    assert "kprobe:kvm_lapic_expired_hv_timer" in program(_plan("timers", "vmx", (6, 1)), None)
    assert "kprobe:kvm_vcpu_halt" in program(_plan("halts", "pvm", (6, 18)), None)


def test_this_kernels_shape_pvm_6_18_without_kvm_vcpu_kick() -> None:
    """As on this machine: kvm_vcpu_kick is inlined (in neither kallsyms nor BTF). wakeups still
    runs, without kick lines, and says what is lost."""
    plan = _plan("wakeups", "pvm", (6, 18), drop=frozenset({"kvm_vcpu_kick"}))
    assert "kvm_vcpu_kick" not in program(plan, None)
    assert plan.lost == ("missing kvm_vcpu_kick (vCPU kick): without it, no kicks of running vCPUs "
                         "(IPIs to force an exit)",)


def test_missing_primary_symbol_fails_naming_it_and_the_loss() -> None:
    with pytest.raises(KprobeUnavailable) as e:
        _plan("handling", "svm", (6, 1), drop=frozenset({"svm_handle_exit"}))
    assert str(e.value) == ("kprobe view 'handling' cannot run (svm, kernel 6.1): missing svm_handle_exit "
                            "(exit handler entry to return): without it, no time spent handling each exit, per reason")
    with pytest.raises(KprobeUnavailable, match=r"missing kvm_vcpu_halt \(halt duration\)"):
        _plan("halts", "vmx", (6, 1), drop=frozenset({"kvm_vcpu_halt"}))   # 6.1 wants kvm_vcpu_halt


def test_wakeups_without_a_halt_probe_counts_wakers_only() -> None:
    text = program(_plan("wakeups", "vmx", (6, 1), drop=frozenset({"kvm_vcpu_halt"})), None)
    assert "kprobe:kvm_vcpu_wake_up { @wake_by[tid] = count(); }" in text and "@hstart" not in text
    assert text.endswith("END { clear(@kvmu_t0); }\n")      # no scratch maps to clear


def test_timers_and_halts_programs() -> None:
    t = program(_plan("timers", "vmx", (6, 1)), None, pids=[9])
    assert "kprobe:apic_timer_fn { @apic_timer[cpu] = count(); }" in t       # hardirq context: never pid-filtered
    assert ("tracepoint:kvm:kvm_msr /args->write && args->ecx == 0x6e0/ { if (pid != 9) { return; } "
            "@tscdeadline_wrmsr[tid] = count(); }") in t
    h = program(_plan("halts", "vmx", (5, 10)), None)
    assert "kprobe:kvm_vcpu_block { @hs[tid] = nsecs; }" in h and "kprobe:kvm_vcpu_on_spin { @spin[tid] = count(); }" in h
    assert "@halt_ns = hist($d)" in h


# ---- parsing bpftrace text output --------------------------------------------------------

KVMEXITS_BT_ISSUE_17 = """\
Attaching 4 probes...
Tracing KVM exits. Ctrl-C to end

@exit_ns[97, ]:
[256, 512)             1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|

@exit_ns[119, ]:
[512, 1K)              1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |
[1K, 2K)               2 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[2K, 4K)               1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |

@exit_ns[4, ]:
[256, 512)            28 |@@@@@@@                                             |
[512, 1K)            188 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|

@exit_ns[114, ]:
[256, 512)           205 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[512, 1K)             37 |@@@@@@@@@                                           |
[1K, 2K)               6 |@                                                   |
"""


def test_parser_on_real_recorded_kvm_bpftrace_output() -> None:
    """Recorded, not constructed: the output of Brendan Gregg's kvmexits.bt (bpf-perf-tools-book,
    originals/Ch16_Hypervisors/kvmexits.bt, a kvm_exit->kvm_entry hist() keyed by [reason, name])
    on Ubuntu 20.04 / 5.4.0-31, as posted in https://github.com/brendangregg/bpf-perf-tools-book/issues/17
    (the first four map blocks, verbatim; the post goes on). A tracepoint program, but the text
    format is bpftrace's own whatever the probe type: multi-keys, an empty string key, hist
    rows with K suffixes. No recorded output of a KVM *kprobe* program was found in public
    sources (searched: bpftrace *_example.txt files, issues, blog posts)."""
    out = parse(KVMEXITS_BT_ISSUE_17)
    assert out.lines == ["Tracing KVM exits. Ctrl-C to end"]
    h = out.hists["exit_ns"]
    assert list(h) == [(97, ""), (119, ""), (4, ""), (114, "")]
    assert [(b.lo, b.hi, b.count) for b in h[(119, "")]] == [(512, 1023, 1), (1024, 2047, 2), (2048, 4095, 1)]
    assert sum(b.count for b in h[(4, "")]) == 216


# Constructed in bpftrace 0.17's text format (as recorded here in RECORDED_HERE_0_17: `@name[k1, k2]: v`,
# a hist()/lhist() block as `@name[k]: ` (trailing space) then `[lo, hi)  count |bars|` rows ended by a blank line,
# `[0]`/`[1]` rows for hist's first buckets, lhist's `(..., lo)` / `[hi, ...)` rows, stats() as
# `count N, average N, total N`), because no host with kprobes was available to record on (this
# one has CONFIG_KPROBES unset and fentry refused). The values are a VMX host's handling view:
# vCPU thread 5301, kvm_exit seen (isa 1): MSR_WRITE (32) x3 at 1000/2000/40000 ns (log-linear
# keys 79, 87, 121 as in test_kvmu_bpf) and HLT (12) x1 at 3000 ns (key 91).
HANDLING_VMX = """\
Attaching 5 probes...


@e_ll[1, 32, 87]: 1
@e_ll[1, 12, 91]: 1
@e_ll[1, 32, 121]: 1
@e_ll[1, 32, 79]: 1

@e_max[1, 12]: 3000
@e_max[1, 32]: 40000

@e_min[1, 12]: 3000
@e_min[1, 32]: 1000

@e_n[1, 12]: 1
@e_n[1, 32]: 3

@e_sum[1, 12]: 3000
@e_sum[1, 32]: 43000

@t_n[5301]: 4

@x[5301, 1, 12]: 1
@x[5301, 1, 32]: 3
"""

# Constructed likewise: a PVM host (kvm_exit silent, so the reason maps hold isa 0, reason 0).
HANDLING_PVM = """\
Attaching 4 probes...


@e_ll[0, 0, 79]: 2

@e_max[0, 0]: 1000
@e_min[0, 0]: 990
@e_n[0, 0]: 2
@e_sum[0, 0]: 1990
@t_n[77]: 2
@x[77, 0, 0]: 2
"""


def test_handling_summary_is_the_latency_document() -> None:
    d = to_dict(kprobe.handling_summary(parse(HANDLING_VMX)))
    assert d["source"] == "bpftrace:kprobe-handling" and d["total_exits"] == 4
    w = d["exits"][0]
    assert (w["reason"], w["count"], w["min_ns"], w["p50_ns"], w["p99_ns"], w["max_ns"], w["mean_ns"]) == \
        ("MSR_WRITE", 3, 1000, 2047, 40000, 40000, 14333.3)
    assert d["exits"][1]["reason"] == "HLT" and d["exits"][1]["p50_ns"] == 3000
    assert d["vcpus"][0]["tid"] == 5301


def test_handling_without_kvm_exit_is_labelled_not_unknown() -> None:
    d = to_dict(kprobe.handling_summary(parse(HANDLING_PVM)))
    assert [(r["reason"], r["count"]) for r in d["exits"]] == [(NO_REASON, 2)]


def test_handling_counts_feed_the_exits_document() -> None:
    from tools.kvm_utils.live import Spec, Target, summarize_counts
    counts = kprobe.handling_counts(parse(HANDLING_VMX), lambda tid: Target(tid, -1, "web1", 0, 5300),
                                    lambda kind, label: Spec(kind, label, -1, None))
    d = summarize_counts(counts, 2.0, None, False, "kprobe")
    assert d["mode"] == "kprobe-counting" and d["total_exits"] == 4
    assert [(r["reason"], r["count"], r["rate"]) for r in d["exits"]] == [("MSR_WRITE", 3, 1.5), ("HLT", 1, 0.5)]
    assert d["vms"] == [{"vm": "web1", "pid": 5300, "count": 4, "rate": 2.0}]


# Constructed in bpftrace 0.17's text format (see above): a wakeups run. Waker 6001 (an
# I/O thread) woke halted vCPU thread 5301 twice and kicked it once; vCPU 5302 was woken
# while running once; hist() of the halted time with its [0]/[1] first rows absent and K/M
# suffixes; posted-interrupt wake-ups on host CPUs 0 and 3.
WAKEUPS = """\
Attaching 5 probes...
^C

@kick[6001, 5301]: 1

@pi_wake[3]: 40
@pi_wake[0]: 2

@slept_ns: 
[512K, 1M)             1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[1M, 2M)               0 |                                                    |
[2M, 4M)               1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|

@wake_running[6001, 5302]: 1

@woke[6001, 5301]: 2

"""


# What a wakeups run inside the nested SVM guest printed (Debian 6.1, fentry): the timer woke
# vCPU 5301 four times, kvm_vcpu_kick fired for each, kvm_vcpu_wake_up never did.
WAKEUPS_INLINED = """\
Attaching 6 probes...
kvm-utils-ready


@kick[0, 5301]: 4

@slept_ns:
[4M, 8M)               4 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|

@unslept[5301]: 1

@woke[0, 5301]: 4

"""


def test_wakeups_name_a_never_hit_wake_up_symbol() -> None:
    plan = _plan("wakeups", "svm", (6, 1), "fentry")
    d = view_summary("wakeups", parse(WAKEUPS_INLINED), 1.0, plan)
    assert d["woke_halted"] == [{"waker": "0", "vcpu": "5301", "count": 4, "rate": 4.0}]
    assert d["wake_up_calls"] == [] and d["halts_unslept"] == [{"vcpu": "5301", "count": 1, "rate": 1.0}]
    assert d["blind"] == [
        "kvm_vcpu_wake_up never fired while 4 halted vCPUs were woken (sched_waking) and kvm_vcpu_kick, which "
        "calls it first, fired 4 times: it is inlined into its callers on this kernel (Debian's 6.1 inlines it "
        "into kvm_vcpu_kick and kvm_make_vcpu_request); woke_halted comes from sched:sched_waking, woke_running "
        "and wake_up_calls see only its out-of-line calls"]
    assert "  blind: kvm_vcpu_wake_up never fired" in render_view(d, "table")
    assert json.loads(render_view(d, "json"))["blind"] == d["blind"]
    # where it fires, nothing is blind; where nothing ran, nothing can be said
    fired = WAKEUPS_INLINED.replace("@kick[0, 5301]: 4", "@kick[0, 5301]: 4\n@wake_call[0, 5301]: 4")
    assert view_summary("wakeups", parse(fired), 1.0, plan)["blind"] == []
    assert view_summary("wakeups", parse("Attaching 6 probes...\n"), 1.0, plan)["blind"] == []


def test_wakeups_document() -> None:
    d = view_summary("wakeups", parse(WAKEUPS), 2.0, name=lambda tid: f"tid {tid}")
    assert d["woke_halted"] == [{"waker": "tid 6001", "vcpu": "tid 5301", "count": 2, "rate": 1.0}]
    assert d["woke_running"][0]["vcpu"] == "tid 5302" and d["kicks"][0]["count"] == 1
    assert d["pi_wakeups"] == [{"cpu": 3, "count": 40, "rate": 20.0}, {"cpu": 0, "count": 2, "rate": 1.0}]
    doc = json.loads(render_view(d, "json"))
    assert doc["view"] == "wakeups"
    # the buckets of bpftrace's [512K, 1M) rows, bounds inclusive as in the latency document
    assert doc["halted_ns_hist"] == [{"lo_ns": 512 << 10, "hi_ns": (1 << 20) - 1, "count": 1},
                                     {"lo_ns": 1 << 20, "hi_ns": (2 << 20) - 1, "count": 0},
                                     {"lo_ns": 2 << 20, "hi_ns": (4 << 20) - 1, "count": 1}]
    assert doc["woke_halted"] == d["woke_halted"]
    text = render_view(d, "table")
    assert "woke_halted" in text and "tid 6001" in text
    assert "  [524288, 1048575]           1" in text.splitlines()


# Constructed in bpftrace 0.17's text format (see above): a halts run with hist's [0]/[1]
# rows, a stats() value and an lhist() block with its underflow/overflow rows (not made by
# our programs; they check the parser reads every row shape bpftrace prints).
HALTS = """\
Attaching 4 probes...

@halt_n[5301]: 3
@halt_ns: 
[0]                    1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[1]                    1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[4K, 8K)               1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|

@halt_ns_sum[5301]: 6002
@lh[1]: 
(..., 0)               2 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |
[0, 50)                4 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[200, ...)             1 |@@@@@@@@@@@@@                                       |

@spin[5301]: 12
@st[5301]: count 3, average 2, total 6
"""


def test_halts_document_and_every_row_shape() -> None:
    out = parse(HALTS)
    assert [(b.lo, b.hi, b.count) for b in out.hists["lh"][(1,)]] == [(None, -1, 2), (0, 49, 4), (200, None, 1)]
    assert out.maps["st"][(5301,)] == {"count": 3, "average": 2, "total": 6}
    d = view_summary("halts", out, 1.0)
    assert d["halts"] == [{"vcpu": "5301", "count": 3, "rate": 3.0, "mean_ns": 2000.7}]
    assert [(b.lo, b.hi) for b in d["halt_ns_hist"]] == [(0, 0), (1, 1), (4096, 8191)]
    assert d["pause_loop_exits"] == [{"vcpu": "5301", "count": 12, "rate": 12.0}]


def test_timers_document() -> None:
    out = parse("@apic_timer[1]: 1000\n@hv_timer[5301]: 998\n@tscdeadline_wrmsr[5301]: 1001\n")
    d = view_summary("timers", out, 1.0)
    assert d["apic_timer_fn"] == [{"cpu": 1, "count": 1000, "rate": 1000.0}]
    assert d["tsc_deadline_wrmsr"][0]["count"] == 1001 and d["hv_timer"][0]["count"] == 998


# Recorded on this machine (bpftrace v0.17.0, kernel 6.18 PVM) from a *tracepoint* program,
# while the bench helper's tiny guest made 50 PIO writes and 7 PIO reads to port 0x10 (and
# its done-port 0xf1 writes); tracepoint programs load here, kprobes do not. The program:
#   tracepoint:kvm:kvm_pio { @pio[tid, args->port, args->rw] = count(); @h = hist(args->port);
#     @hk[args->rw] = hist(nsecs % 5000); @l = lhist(args->port, 0, 100, 10);
#     @lk[args->rw] = lhist(nsecs % 300, 0, 200, 50); @s = sum(args->size); @mn[args->rw] = min(args->port);
#     @st[tid] = stats(args->size); @av = avg(args->size); @one = count(); }
#   interval:s:4 { exit(); }  END { printf("kvm-utils-end\n"); }
# Verbatim except BEGIN's ready line, and hist/lhist blocks shortened (rows dropped).
RECORDED_HERE_0_17 = """\
Attaching 5 probes...
kvm-utils-end


@av: 1

@h: 
[16, 32)              57 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[32, 64)               0 |                                                    |
[64, 128)              0 |                                                    |
[128, 256)             2 |@                                                   |

@hk[0]: 
[128, 256)             1 |@@@@@@@@@@@@@@@@@                                   |
[512, 1K)              1 |@@@@@@@@@@@@@@@@@                                   |
[4K, 8K)               1 |@@@@@@@@@@@@@@@@@                                   |

@l: 
[10, 20)              57 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[20, 30)               0 |                                                    |
[100, ...)             2 |@                                                   |

@lk[1]: 
[0, 50)                8 |@@@@@@@@@@@@@@@@                                    |
[200, ...)            25 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|

@mn[1]: 16
@mn[0]: 16

@one: 59
@pio[31358, 241, 1]: 1
@pio[31356, 241, 1]: 1
@pio[31358, 16, 0]: 7
@pio[31356, 16, 1]: 50
@s: 59
@st[31356]: count 51, average 1, total 51
@st[31358]: count 8, average 1, total 8

"""


def test_parser_on_output_recorded_here() -> None:
    out = parse(RECORDED_HERE_0_17)
    assert out.lines == ["kvm-utils-end"]
    assert out.maps["pio"] == {(31358, 241, 1): 1, (31356, 241, 1): 1, (31358, 16, 0): 7, (31356, 16, 1): 50}
    assert out.maps["av"] == {(): 1} and out.maps["one"] == {(): 59} and out.maps["mn"] == {(1,): 16, (0,): 16}
    assert out.maps["st"][(31356,)] == {"count": 51, "average": 1, "total": 51}
    assert [(b.lo, b.hi, b.count) for b in out.hists["h"][()]] == [(16, 31, 57), (32, 63, 0), (64, 127, 0), (128, 255, 2)]
    assert [(b.lo, b.hi) for b in out.hists["hk"][(0,)]] == [(128, 255), (512, 1023), (4096, 8191)]
    assert [(b.lo, b.hi, b.count) for b in out.hists["l"][()]][-1] == (100, None, 2)
    assert [(b.lo, b.hi, b.count) for b in out.hists["lk"][(1,)]] == [(0, 49, 8), (200, None, 25)]


def test_bad_hist_bound_is_named() -> None:
    with pytest.raises(ValueError, match="'12Q'"):
        parse("@h:\n[12Q, 13Q)   1 |@|\n")


# ---- auto --------------------------------------------------------------------------------

def test_auto_picks_kprobe_only_where_tracepoints_cannot_answer() -> None:
    use, why = auto_picks_kprobe("exits", "intel", "kprobe", "")
    assert not use and "tracepoints answer exits" in why
    use, why = auto_picks_kprobe("latency", None, "fentry", "")
    assert use and "kvm_exit does not fire here" in why and "fentry" in why
    use, why = auto_picks_kprobe("exits", None, None, "CONFIG_KPROBES is not set")
    assert not use and why.endswith("unavailable: CONFIG_KPROBES is not set")


# ---- the host ------------------------------------------------------------------------------

def _support():
    from tools.kvm_utils import doctor
    from tools.kvm_utils.sources.tracefs import find_tracefs
    return doctor.kprobe_engine_support(find_tracefs())


def test_kprobe_commands_say_why_they_cannot_run_here() -> None:
    """Where the engine cannot attach, each command fails with doctor's own reason."""
    support = _support()
    if support.kind is not None:
        pytest.skip(f"the kprobe engine attaches here ({support.kind}): the live test covers it")
    for argv in (["kprobe", "wakeups", "1"], ["exits", "--engine", "kprobe", "1"], ["latency", "--engine", "kprobe", "1"]):
        r = subprocess.run([sys.executable, "-m", "tools.kvm_utils", *argv], capture_output=True, text=True,
                           timeout=120, cwd=REPO)
        assert r.returncode == 2 and support.why in r.stderr, (argv, r.stderr)


@pytest.mark.root
@pytest.mark.integration
@pytest.mark.parametrize("view", ["handling", "wakeups", "timers", "halts"])
def test_live_kprobe_views_run(view) -> None:
    """Each view's program is accepted by the host's bpftrace and attaches, and its output parses.
    Skipped where doctor says the engine cannot attach (this machine: CONFIG_KPROBES unset, fentry EPERM)."""
    support = _support()
    if support.kind is None:
        pytest.skip(f"kprobe engine unavailable here: {support.why}")
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace not installed")
    r = subprocess.run([sys.executable, "-m", "tools.kvm_utils", "kprobe", view, "1", "--format", "json"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    if r.returncode == 2 and "cannot run" in r.stderr:
        pytest.skip(r.stderr.strip())      # a symbol missing on this kernel, named by the engine
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert ("exits" in d) if view == "handling" else (d["view"] == view)


def test_view_coverage_names_blind_views_for_doctor() -> None:
    from tools.kvm_utils.sources.kprobe import view_coverage
    svm = dict((v, (ok, d)) for v, ok, d in view_coverage(kprobe_table.resolve((6, 1), "svm", EVERY), True))
    assert svm["handling"] == (True, "probes svm_handle_exit")
    ok, d = svm["wakeups"]
    assert ok and d.startswith("probes kvm_vcpu_wake_up, kvm_vcpu_halt, kvm_vcpu_kick, sched:sched_waking; who woke")
    assert "blind: not applicable to svm on 6.1: no such probe there (posted-interrupt wake-ups" in d
    assert "(LAPIC timer expiries through the VMX preemption timer)" in svm["timers"][1]
    no_waking = dict((v, d) for v, _, d in view_coverage(kprobe_table.resolve((6, 1), "svm", EVERY), False))
    assert "no sched:sched_waking tracepoint: who woke a halted vCPU only where kvm_vcpu_wake_up" in no_waking["wakeups"]
    blind = dict((v, (ok, d)) for v, ok, d in
                 view_coverage(kprobe_table.resolve((6, 1), "svm", EVERY - {"svm_handle_exit"}), True))
    assert blind["handling"] == (False, "blind: missing svm_handle_exit (exit handler entry to return): without it, "
                                        "no time spent handling each exit, per reason")
