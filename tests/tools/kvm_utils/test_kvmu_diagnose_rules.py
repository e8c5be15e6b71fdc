"""Pure tests of diagnose's evidence builders and rules (thresholds, branches, bpf maps)."""

from __future__ import annotations

from collections import Counter

from tools.kvm_utils.aggregate import ThreadInfo
from tools.kvm_utils.diagnose.evidence import Evidence, from_bpf_maps, from_events, pmu_period_s
from tools.kvm_utils.diagnose.rules import Thresholds, diagnose
from tools.kvm_utils.diagnose.run import bpf_script
from tools.kvm_utils.events import Entry, Exit, Mmio, Msr, Pio, Wakeup

T = {1: ThreadInfo(0, "vm1"), 2: ThreadInfo(1, "vm1"), 3: ThreadInfo(0, "vm2")}


def rules_of(ev: Evidence, **kw) -> list[str]:
    return [f.rule for f in diagnose(ev, Thresholds(**kw)).findings]


def test_clock_threshold_and_min_count() -> None:
    ev = Evidence(1.0, "t", T, pio=Counter({(1, 0xb008, False): 19}))
    assert rules_of(ev) == []                              # 19 < min_count 20
    ev.pio[(1, 0xb008, False)] += 1
    d = diagnose(ev)
    assert [f.rule for f in d.findings] == ["clocksource"] and d.findings[0].data["ports"] == {"0xb008": 20}
    assert rules_of(Evidence(10.0, "t", T, pio=Counter({(1, 0x608, False): 50}))) == []   # 5/s < 10/s
    assert rules_of(Evidence(1.0, "t", T, pio=Counter({(1, 0x608, True): 500}))) == []    # writes: not a clock read


def test_hpet_reads_are_a_clocksource_finding() -> None:
    d = diagnose(Evidence(1.0, "t", T, mmio=Counter({(1, 0xfed000f0, False): 100})))
    assert d.findings[0].data["clocksource"] == "hpet"


def test_rules_are_per_vm() -> None:
    # 60k/s TSC_DEADLINE writes in each of two VMs: neither VM crosses 100k/s
    ev = Evidence(1.0, "t", T, msr=Counter({(1, 0x6e0, True): 60_000, (3, 0x6e0, True): 60_000}))
    assert rules_of(ev) == []
    ev.msr[(2, 0x6e0, True)] = 50_000
    d = diagnose(ev)
    assert [(f.rule, f.vm) for f in d.findings] == [("tsc-deadline-storm", "vm1")]
    assert [f.rule for f in diagnose(ev, vm="vm2").findings] == []


def test_ipi_storm_reschedule_points_at_idle_polling() -> None:
    ev = Evidence(1.0, "t", T, msr=Counter({(1, 0x830, True): 20_000}),
                  icr_vectors=Counter({(1, 0xfd): 15_000, (1, 0xfc): 5_000}))
    f = diagnose(ev).findings[0]
    assert f.rule == "ipi-storm" and "RESCHEDULE" in f.advice and "[idle] poll" in f.fix


def test_hlt_on_every_vcpu_asks_for_irq_affinity_first() -> None:
    ev = Evidence(1.0, "t", T, exits=Counter({(1, "HLT"): 3000, (2, "hlt"): 2000, (1, "EXTERNAL_INTERRUPT"): 5}),
                  wakeups=Counter({1: 3000, 2: 2000}))
    f = diagnose(ev, vm="vm1").findings[0]
    assert f.data["spread_over_all_vcpus"] is True and "irqaffinity" in f.fix and "nohlt_list=0,1" in f.advice


def test_events_builder_ept_mmio_and_wakeups() -> None:
    evs = [Exit(1, 0, "EPT_VIOLATION", 0), Entry(1, 10, 0),                       # RAM fault
           Exit(1, 20, "EPT_VIOLATION", 0), Mmio(1, 21, 0xfebd1000, True, 4, 1), Entry(1, 30, 0),   # MMIO
           Exit(1, 40, "EPT_MISCONFIG", 0), Mmio(1, 41, 0xfebd1000, True, 4, 1), Entry(1, 50, 0),
           Exit(1, 60, "npf", 0), Exit(1, 70, "HLT", 0),                           # closed by next exit
           Wakeup(1, 80, 9000, True, True), Entry(1, 81, 0),
           Msr(1, 90, 0x830, True, 0x2000000fc), Msr(1, 91, 0x38f, True, 0), Pio(1, 92, 0x608, False, 4, 1, 7),
           Exit(2, 100, "EPT_VIOLATION", 1)]                                       # trace ends: still a fault
    ev = from_events(evs, 1.0, T)
    assert ev.mem_faults == Counter({1: 2, 2: 1})
    assert ev.mmio == Counter({(1, 0xfebd1000, True): 2})
    assert ev.wakeups == Counter({1: 1}) and ev.icr_vectors == Counter({(1, 0xfc): 1})
    assert ev.pmu_times == {1: [91]} and ev.saw_exits


def test_pmu_period() -> None:
    s = 1_000_000_000
    assert pmu_period_s([0, 10, 20, 10 * s, 10 * s + 5, 20 * s]) == (3, 10.0)
    assert pmu_period_s([5, 6]) == (1, None)


def test_from_bpf_maps_and_unknown_threads() -> None:
    maps = {"x": {(100, 1, 1, 12): 5000, (100, 1, 1, 48): 10}, "f": {(100, 1): 7},
            "m": {(200, 9, 0x830, 1): 30}, "icr": {(200, 9, 0xfc): 30},
            "p": {(100, 1, 0x608, 0): 40}, "mm": {(100, 1, 0xfed000f0, 0): 3},
            "u": {(100, 1, 2): 40}, "w": {(100, 1): 4999}}
    ev = from_bpf_maps(maps, 2.0, {1: ThreadInfo(0, "web")})
    assert ev.exits == Counter({(1, "HLT"): 5000, (1, "EPT_VIOLATION"): 10})
    assert ev.user_exits == Counter({(1, "IO"): 40}) and ev.wakeups[1] == 4999 and ev.mem_faults[1] == 7
    assert ev.vm_of(9) == "pid200" and ev.vms() == ["pid200", "web"]
    assert [f.rule for f in diagnose(ev).findings] == ["clocksource", "hlt-wakeups"]


def test_no_exits_means_not_evaluated() -> None:
    d = diagnose(Evidence(1.0, "t", T, pio=Counter({(1, 0x10, True): 5})))
    assert d.findings == () and {n["rule"] for n in d.not_evaluated} == {"hlt-wakeups", "memory-faults"}


def test_bpf_script_stops_after_duration() -> None:
    s = bpf_script(2.5)
    # the window by the clock (tools/kvm_utils/sources/bpfwindow.py), its length stamped
    assert "if (nsecs - @kvmu_t0 >= 2500000000) { printf(\"kvm-utils-elapsed-ns" in s and "exit(); }" in s
    assert "kvm-utils-ready" in s
    assert "interval" not in bpf_script(None)


def test_threshold_option_parses_names_and_values_and_refuses_the_rest() -> None:
    import pytest
    from tools.kvm_utils.diagnose.rules import parse_threshold, with_thresholds
    assert parse_threshold("tsc_deadline_per_s=20000") == ("tsc_deadline_per_s", 20000.0)
    assert parse_threshold(" min_count = 5") == ("min_count", 5) and isinstance(parse_threshold("min_count=5")[1], int)
    for bad, says in [("tsc=1", "expected NAME=VALUE with NAME one of clock_reads_per_s"),
                      ("icr_per_s", "expected NAME=VALUE"), ("icr_per_s=many", "icr_per_s: 'many' is not a number"),
                      ("icr_per_s=0", "icr_per_s: must be a positive number, not 0"),
                      ("hlt_per_s=inf", "must be a positive number"), ("hlt_per_s=nan", "must be a positive number"),
                      ("min_count=2.5", "min_count: must be a whole number, not 2.5")]:
        with pytest.raises(ValueError, match=says.replace("(", r"\(")):
            parse_threshold(bad)
    th = with_thresholds([("icr_per_s", 100.0), ("icr_per_s", 50.0)])   # the last one given holds
    assert th == Thresholds(icr_per_s=50.0)
    ev = Evidence(1.0, "t", T, msr=Counter({(1, 0x830, True): 60}))
    assert rules_of(ev) == []                                  # 60/s < 10,000/s
    d = diagnose(ev, th)
    assert [f.rule for f in d.findings] == ["ipi-storm"]
    assert d.changed_thresholds() == {"icr_per_s": 50.0} and d.to_dict()["thresholds"]["icr_per_s"] == 50.0
    from tools.kvm_utils.diagnose.run import render
    assert "  thresholds set: icr_per_s=50\n" in render(d, "table")
    assert "thresholds set" not in render(diagnose(ev), "table")


def test_threshold_option_on_the_command_line() -> None:
    """argparse names the option and the reason, and nothing runs."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "tools.kvm_utils", "diagnose", "--threshold", "icr_per_s=-5",
                        "--input", "/nonexistent"], capture_output=True, text=True)
    assert r.returncode == 2 and "argument --threshold: icr_per_s: must be a positive number, not -5" in r.stderr


def test_lost_events_are_carried_to_the_output() -> None:
    """A record whose header says the buffer overran: the diagnosis says its counts are lower
    bounds (table and JSON), and per-VM evidence keeps the number."""
    from tools.kvm_utils.diagnose.run import render
    ev = Evidence(1.0, "t", T, msr=Counter({(1, 0x830, True): 20_000}), lost_events=1234)
    assert ev.only_vm("vm1").lost_events == 1234
    d = diagnose(ev)
    assert d.to_dict()["lost_events"] == 1234
    assert "  1234 events lost (the trace buffer overran): counts and rates below are lower bounds" in render(d, "table")
    assert "events lost" not in render(diagnose(Evidence(1.0, "t", T)), "table")
