"""The one parser of bpftrace's output (sources/bpftrace_output.py), on output recorded here in
both of bpftrace's modes, and the one histogram bucket rule (aggregate.Bucket: bounds
inclusive) through every path a histogram takes: traces (aggregate.log2_hist), bpftrace's
printed hist() in text and JSON, and the log-linear maps of the latency engine."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tools.kvm_utils.aggregate import Bucket, log2_bucket, log2_hist
from tools.kvm_utils.sources.bpf import _BUCKET, bucket_bounds, ll_stats
from tools.kvm_utils.sources.bpftrace_output import int_maps, parse
from tools.kvm_utils.sources.bpfcount import parse_record

# One program, every shape of value bpftrace prints: hist() fed values on and either side of
# its power-of-two edges, a keyed hist with a string in its key, lhist() with its underflow
# and overflow rows, multi-key, scalar, string-keyed, stats(), avg() and string-valued maps,
# and a printf line.
PROGRAM = """\
BEGIN {
  @h = hist(0); @h = hist(1); @h = hist(2); @h = hist(3); @h = hist(4); @h = hist(7); @h = hist(8);
  @h = hist(15); @h = hist(16); @h = hist(1023); @h = hist(1024);
  @hk[1, "x y"] = hist(4);
  @l = lhist(-1, 0, 100, 50); @l = lhist(0, 0, 100, 50); @l = lhist(49, 0, 100, 50);
  @l = lhist(50, 0, 100, 50); @l = lhist(100, 0, 100, 50);
  @m[1, 2] = count(); @one = count(); @name[3, "a b"] = count(); @st[7] = stats(5); @av = avg(4);
  @c[1] = comm;
  printf("kvm-utils-end\\n");
  exit();
}
"""
HIST_VALUES = (0, 1, 2, 3, 4, 7, 8, 15, 16, 1023, 1024)

# `bpftrace PROGRAM` and `bpftrace -f json PROGRAM`, recorded on this machine (bpftrace
# v0.17.0, kernel 6.18), verbatim (stderr's RLIMIT_MEMLOCK warning left out). The two modes
# print the same buckets differently: text `[2, 4)`, JSON `{"min": 2, "max": 3}`.
TEXT = """\
Attaching 1 probe...
kvm-utils-end


@av: 4

@c[1]: bpftrace
@h: 
[0]                    1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |
[1]                    1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |
[2, 4)                 2 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[4, 8)                 2 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[8, 16)                2 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[16, 32)               1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |
[32, 64)               0 |                                                    |
[64, 128)              0 |                                                    |
[128, 256)             0 |                                                    |
[256, 512)             0 |                                                    |
[512, 1K)              1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |
[1K, 2K)               1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |

@hk[1, x y]: 
[4, 8)                 1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|

@l: 
(..., 0)               1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |
[0, 50)                2 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[50, 100)              1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |
[100, ...)             1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |

@m[1, 2]: 1
@name[3, a b]: 1
@one: 1
@st[7]: count 1, average 5, total 5

"""

JSON = """\
{"type": "attached_probes", "data": {"probes": 1}}
{"type": "printf", "data": "kvm-utils-end\\n"}


{"type": "stats", "data": {"@av": 4}}
{"type": "map", "data": {"@c": {"1": "bpftrace"}}}
{"type": "hist", "data": {"@h": [{"min": 0, "max": 0, "count": 1}, {"min": 1, "max": 1, "count": 1}, {"min": 2, "max": 3, "count": 2}, {"min": 4, "max": 7, "count": 2}, {"min": 8, "max": 15, "count": 2}, {"min": 16, "max": 31, "count": 1}, {"min": 32, "max": 63, "count": 0}, {"min": 64, "max": 127, "count": 0}, {"min": 128, "max": 255, "count": 0}, {"min": 256, "max": 511, "count": 0}, {"min": 512, "max": 1023, "count": 1}, {"min": 1024, "max": 2047, "count": 1}]}}
{"type": "hist", "data": {"@hk": {"1,x y": [{"min": 4, "max": 7, "count": 1}]}}}
{"type": "hist", "data": {"@l": [{"max": -1, "count": 1}, {"min": 0, "max": 49, "count": 2}, {"min": 50, "max": 99, "count": 1}, {"min": 100, "count": 1}]}}
{"type": "map", "data": {"@m": {"1,2": 1}}}
{"type": "map", "data": {"@name": {"3,a b": 1}}}
{"type": "map", "data": {"@one": 1}}
{"type": "stats", "data": {"@st": {"7": {"count": 1, "average": 5, "total": 5}}}}
"""

# The latency engine's log-linear key (bpf._BUCKET, 8 sub-buckets per power of two) of each
# value, as this machine's bpftrace computed it (`@ll[V] = $k` after _BUCKET with $d = V,
# `-f json`), recorded likewise.
LL_JSON = ('{"type": "map", "data": {"@ll": {"1": 1, "7": 7, "8": 24, "9": 25, "15": 31, "17": 32, "16": 32, '
           '"1023": 79, "1000": 79, "1024": 80, "40000": 121, "4294967296": 256, "4831838208": 257}}}')


def _holding(buckets, v: int) -> list[Bucket]:
    return [b for b in buckets if (b.lo is None or b.lo <= v) and (b.hi is None or v <= b.hi)]


def test_both_modes_parse_to_the_same_output() -> None:
    text, js = parse(TEXT), parse(JSON)
    assert text == js
    assert js.lines == ["kvm-utils-end"]
    assert js.maps == {"av": {(): 4}, "c": {(1,): "bpftrace"}, "m": {(1, 2): 1}, "name": {(3, "a b"): 1},
                       "one": {(): 1}, "st": {(7,): {"count": 1, "average": 5, "total": 5}}}
    assert js.hists["hk"] == {(1, "x y"): [Bucket(4, 7, 1)]}
    assert js.hists["l"] == {(): [Bucket(None, -1, 1), Bucket(0, 49, 2), Bucket(50, 99, 1), Bucket(100, None, 1)]}
    assert int_maps(js) == {"av": {(): 4}, "c": {}, "m": {(1, 2): 1}, "name": {}, "one": {(): 1}, "st": {}}


def test_bpftraces_hist_is_our_trace_histogram_edges_included() -> None:
    """bpftrace's own hist() of HIST_VALUES, read back from either mode, is the histogram
    kvm-utils builds from traces of the same values (aggregate.log2_hist): same buckets,
    same counts; every value, on an edge or not, is held by exactly one bucket, the same one."""
    for out in (parse(TEXT), parse(JSON)):
        printed = out.hists["h"][()]
        assert tuple(b for b in printed if b.count) == log2_hist(HIST_VALUES)
        for v in HIST_VALUES:
            (b,) = _holding(printed, v)
            assert (b.lo, b.hi) == log2_bucket(v)
    assert log2_bucket(8) == (8, 15) and log2_bucket(7) == (4, 7) and log2_bucket(16) == (16, 31)


@pytest.mark.parametrize("row,bucket", [("[0]                    3 |@|", Bucket(0, 0, 3)),
                                        ("[4, 8)                 3 |@|", Bucket(4, 7, 3)),
                                        ("[512, 1K)              3 |@|", Bucket(512, 1023, 3)),
                                        ("[2G, 4G)               3 |@|", Bucket(2 << 30, (4 << 30) - 1, 3)),
                                        ("(..., 0)               3 |@|", Bucket(None, -1, 3)),
                                        ("[100, ...)             3 |@|", Bucket(100, None, 3))])
def test_text_rows_become_inclusive_buckets(row, bucket) -> None:
    assert parse(f"@h: \n{row}\n").hists["h"][()] == [bucket]


def test_log_linear_buckets_fold_into_the_same_power_of_two_buckets() -> None:
    """The latency engine keeps log-linear buckets in BPF; the histogram it reports is the
    same power-of-two buckets as the trace path's, a value on an edge included."""
    for (v,), k in int_maps(parse(LL_JSON))["ll"].items():
        lo, hi = bucket_bounds(k)
        assert lo <= v <= hi
        assert ll_stats(1, 1, v, v, v, {k: 1}).hist == log2_hist([v]) == (Bucket(*log2_bucket(v), 1),)


def test_counting_records_are_read_by_the_same_parser() -> None:
    assert parse_record('{"type": "map", "data": {"@u": {"4101,6": 5}}}') == ("u", {(4101, 6): 5})
    assert parse_record('{"type": "printf", "data": "kvm-utils-tick\\n"}') == "tick"
    assert parse_record('{"type": "printf", "data": "kvm-utils-ready\\n"}') is None
    assert parse_record('{"type": "attached_probes", "data": {"probes": 9}}') is None


def _ll_program(values) -> str:
    return "BEGIN {\n" + "".join(f"  $d = (uint64){v};{_BUCKET}  @ll[{v}] = $k;\n" for v in values) + "  exit();\n}\n"


@pytest.mark.root
@pytest.mark.integration
def test_live_bpftrace_prints_what_was_recorded() -> None:
    """This host's bpftrace, both modes, on PROGRAM and on _BUCKET's keys: what the pure tests
    above assume of bpftrace is what it prints (BEGIN probes only: no kvm needed)."""
    exe = shutil.which("bpftrace")
    if exe is None:
        pytest.skip("bpftrace not installed")

    def run(*args: str) -> str:
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout
    assert parse(run("-e", PROGRAM)) == parse(run("-f", "json", "-e", PROGRAM)) == parse(TEXT)
    recorded = int_maps(parse(LL_JSON))["ll"]
    assert int_maps(parse(run("-f", "json", "-e", _ll_program(v for (v,) in recorded))))["ll"] == recorded
