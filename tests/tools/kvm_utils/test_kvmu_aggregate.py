"""Pairing and statistics on hand-built event sequences (pure)."""

from __future__ import annotations

import pytest

from tools.kvm_utils.aggregate import (Bucket, ThreadInfo, log2_bucket, log2_hist, nearest_rank,
                                       pair, stats, summarize)
from tools.kvm_utils.events import Entry, Exit, Mmio, Msr, Pio, UserspaceExit


@pytest.mark.parametrize("values,p,expected", [
    ([10], 50, 10), ([10], 99, 10),
    ([1, 2], 50, 1), ([1, 2], 99, 2),
    ([1, 2, 3, 4], 50, 2), ([1, 2, 3, 4], 99, 4), ([1, 2, 3, 4], 25, 1), ([1, 2, 3, 4], 26, 2),
    (list(range(1, 101)), 50, 50), (list(range(1, 101)), 99, 99), (list(range(1, 101)), 100, 100),
    (list(range(1, 201)), 99, 198),   # rank ceil(0.99 * 200) = 198
    (list(range(1, 11)), 99, 10),     # rank ceil(9.9) = 10
])
def test_nearest_rank(values, p, expected) -> None:
    assert nearest_rank(values, p) == expected


@pytest.mark.parametrize("v,bucket", [(0, (0, 0)), (1, (1, 1)), (2, (2, 3)), (3, (2, 3)),
                                      (4, (4, 7)), (1000, (512, 1023)), (1024, (1024, 2047))])
def test_log2_bucket_matches_bpftrace_hist_bounds(v, bucket) -> None:
    assert log2_bucket(v) == bucket


def test_stats_values_and_histogram() -> None:
    s = stats(5, [3000, 1000, 4000, 2000])
    assert (s.count, s.min_ns, s.p50_ns, s.p99_ns, s.max_ns, s.mean_ns) == (5, 1000, 2000, 4000, 4000, 2500.0)
    assert s.hist == (Bucket(512, 1023, 1), Bucket(1024, 2047, 1), Bucket(2048, 4095, 2))
    assert log2_hist([]) == ()


def test_stats_without_latency_keeps_count() -> None:
    s = stats(7, [])
    assert (s.count, s.min_ns, s.p50_ns, s.mean_ns, s.hist) == (7, None, None, None, ())


def test_pairing_is_per_thread_even_when_interleaved() -> None:
    events = [
        Exit(1, 100, "MSR_WRITE", 0), Exit(2, 110, "HLT", 1),
        Msr(1, 101, 0x6e0, True, 5), Entry(1, 130, 0),       # tid 1: 30 ns
        Entry(2, 1110, 1),                                   # tid 2: 1000 ns
        Exit(1, 200, "IO_INSTRUCTION", 0), Pio(1, 201, 0x608, False, 4, 1, 9),
        UserspaceExit(1, 202, "IO"), Entry(1, 250, 0),       # 50 ns
    ]
    p = pair(events)
    assert dict(p.exit_count) == {"MSR_WRITE": 1, "HLT": 1, "IO_INSTRUCTION": 1}
    assert dict(p.exit_lat) == {"MSR_WRITE": [30], "HLT": [1000], "IO_INSTRUCTION": [50]}
    assert dict(p.access_lat) == {("msr", 0x6e0, True): [30], ("pio", 0x608, False): [50]}
    assert dict(p.user_exits) == {"IO": 1}
    assert p.unpaired_exits == 0


def test_exit_without_entry_is_counted_but_has_no_latency() -> None:
    # tid 1's first exit is followed by a second exit (entry lost), the last one by nothing
    p = pair([Exit(1, 0, "A", 0), Msr(1, 1, 0x10, False, 0), Exit(1, 10, "B", 0), Entry(1, 15, 0),
              Exit(1, 20, "C", 0)])
    assert dict(p.exit_count) == {"A": 1, "B": 1, "C": 1}
    assert dict(p.exit_lat) == {"B": [5]}
    assert p.unpaired_exits == 2
    assert dict(p.access_count) == {("msr", 0x10, False): 1}
    assert ("msr", 0x10, False) not in p.access_lat


def test_entry_without_exit_and_accesses_outside_exits() -> None:
    """PVM-style stream: no kvm_exit at all, accesses are still counted (without latency)."""
    p = pair([Entry(1, 5, 0), Pio(1, 6, 0x10, True, 1, 1, 0), Pio(1, 7, 0x10, True, 1, 1, 0),
              Mmio(1, 8, 0x10000, False, 4, 0, unsatisfied=True), Mmio(1, 9, 0x10000, False, 4, 7)])
    assert dict(p.exit_count) == {}
    assert dict(p.access_count) == {("pio", 0x10, True): 2, ("mmio", 0x10000, False): 1}
    assert dict(p.access_lat) == {}


def test_summarize_orders_rows_and_fills_threads() -> None:
    p = pair([Exit(7, 0, "B", None), Entry(7, 10, None), Exit(7, 20, "A", None), Entry(7, 40, None),
              Exit(8, 0, "B", 3), Msr(8, 1, 0x830, True, 0), Entry(8, 5, 3)])
    s = summarize(p, {7: ThreadInfo(2, "web-1")})
    assert [(r.reason, r.stats.count, r.pct) for r in s.exits] == [("B", 2, 66.67), ("A", 1, 33.33)]
    assert [(v.tid, v.vcpu, v.vm, v.count, v.events) for v in s.vcpus] == [
        (7, 2, "web-1", 2, 4), (8, 3, None, 1, 3)]
    assert [(r.key, r.name, r.stats.count, r.stats.p50_ns) for r in s.msr] == [(0x830, "X2APIC_ICR", 1, 5)]
    assert s.total_exits == 3
