"""Pure aggregation: pair kvm_exit -> kvm_entry per vCPU thread, then count and summarise.

Exit-handling time is `kvm_entry.ts - kvm_exit.ts` on the same thread (what `perf kvm
stat` measures). An MSR/PIO/MMIO access seen between the two belongs to that exit and
carries its latency. Percentiles are nearest-rank: the p-th percentile of n sorted
samples is the value at rank ceil(p * n / 100).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tools.kvm_utils.arch import msr_name
from tools.kvm_utils.events import Entry, Event, Exit, Mmio, Msr, Pio, UserspaceExit


@dataclass(frozen=True)
class Bucket:
    """A histogram bucket of integer values, **both bounds inclusive**: hist()'s buckets are
    [0,0], [1,1], [2,3], [4,7]... (bpftrace's JSON writes them so; its text prints the same
    buckets half-open, [2, 4)). A value on a power-of-two edge, 4, is the lowest of its
    bucket, never the top of the one below. None is an open end (lhist's `(..., 0)` is
    (None, -1), `[100, ...)` is (100, None)). Every histogram kvm-utils reports, from
    traces, from bpftrace's maps or from its printed hists, is made of these, and JSON
    writes them as `{"lo_ns", "hi_ns", "count"}`."""

    lo: int | None
    hi: int | None
    count: int


@dataclass(frozen=True)
class Stats:
    count: int
    min_ns: int | None = None
    p50_ns: int | None = None
    p99_ns: int | None = None
    max_ns: int | None = None
    mean_ns: float | None = None
    hist: tuple[Bucket, ...] = ()


def nearest_rank(sorted_values: list[int], p: int) -> int:
    """Nearest-rank percentile of an ascending, non-empty list (p in 1..100)."""
    rank = -(-p * len(sorted_values) // 100)   # ceil without floats
    return sorted_values[max(rank, 1) - 1]


def log2_bucket(value: int) -> tuple[int, int]:
    """(lo, hi) of bpftrace hist()'s bucket holding `value`: [2^k, 2^(k+1) - 1], 0 alone
    (and negatives with it: latencies are never negative)."""
    if value <= 0:
        return (0, 0)
    lo = 1 << (value.bit_length() - 1)
    return (lo, 2 * lo - 1)


def log2_hist(values: Iterable[int]) -> tuple[Bucket, ...]:
    counts = Counter(log2_bucket(v) for v in values)
    return tuple(Bucket(lo, hi, n) for (lo, hi), n in sorted(counts.items()))


def stats(count: int, latencies: list[int]) -> Stats:
    """Stats for `count` events of which `latencies` were paired (may be fewer or none)."""
    if not latencies:
        return Stats(count)
    lat = sorted(latencies)
    return Stats(count, lat[0], nearest_rank(lat, 50), nearest_rank(lat, 99), lat[-1],
                 round(sum(lat) / len(lat), 1), log2_hist(lat))


# ------------------------------------------------------------------------ pairing

@dataclass
class _Open:
    exit: Exit
    accesses: list[tuple[str, int, bool]] = field(default_factory=list)


@dataclass
class Paired:
    """Samples keyed for aggregation; latency lists hold only paired samples."""

    exit_count: Counter = field(default_factory=Counter)                # reason -> n
    exit_lat: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    access_count: Counter = field(default_factory=Counter)              # (kind, key, write) -> n
    access_lat: dict[tuple, list[int]] = field(default_factory=lambda: defaultdict(list))
    user_exits: Counter = field(default_factory=Counter)                # reason -> n
    tid_exits: Counter = field(default_factory=Counter)
    tid_events: Counter = field(default_factory=Counter)
    tid_vcpu: dict[int, int] = field(default_factory=dict)
    unpaired_exits: int = 0       # kvm_exit with no kvm_entry (trace cut, lost events)


class Pairer:
    """Feed events in trace order (per thread order is what matters); read `.result`."""

    def __init__(self) -> None:
        self.result = Paired()
        self._open: dict[int, _Open] = {}

    def feed(self, ev: Event) -> None:
        r = self.result
        r.tid_events[ev.tid] += 1
        if isinstance(ev, Exit):
            if ev.tid in self._open:          # previous exit never saw its entry
                r.unpaired_exits += 1
            self._open[ev.tid] = _Open(ev)
            r.exit_count[ev.reason] += 1
            r.tid_exits[ev.tid] += 1
            if ev.vcpu is not None:
                r.tid_vcpu[ev.tid] = ev.vcpu
        elif isinstance(ev, Entry):
            if ev.vcpu is not None:
                r.tid_vcpu.setdefault(ev.tid, ev.vcpu)
            op = self._open.pop(ev.tid, None)
            if op is not None:
                lat = ev.ts_ns - op.exit.ts_ns
                r.exit_lat[op.exit.reason].append(lat)
                for key in op.accesses:
                    r.access_lat[key].append(lat)
        elif isinstance(ev, UserspaceExit):
            r.user_exits[ev.reason] += 1
        else:
            key = _access_key(ev)
            if key is None:
                return
            r.access_count[key] += 1
            op = self._open.get(ev.tid)
            if op is not None:
                op.accesses.append(key)

    def finish(self) -> Paired:
        self.result.unpaired_exits += len(self._open)
        self._open.clear()
        return self.result


def _access_key(ev: Event) -> tuple[str, int, bool] | None:
    if isinstance(ev, Msr):
        return ("msr", ev.ecx, ev.write)
    if isinstance(ev, Pio):
        return ("pio", ev.port, ev.write)
    if isinstance(ev, Mmio) and not ev.unsatisfied:   # its completing "read" is counted
        return ("mmio", ev.gpa, ev.write)
    return None


def pair(events: Iterable[Event]) -> Paired:
    p = Pairer()
    for ev in events:
        p.feed(ev)
    return p.finish()


# ------------------------------------------------------------------------ summary

@dataclass(frozen=True)
class ReasonRow:
    reason: str
    pct: float
    stats: Stats


@dataclass(frozen=True)
class AccessRow:
    kind: str      # "msr" | "pio" | "mmio"
    key: int       # MSR index, port, GPA
    write: bool
    stats: Stats

    @property
    def name(self) -> str | None:
        return msr_name(self.key) if self.kind == "msr" else None


@dataclass(frozen=True)
class VcpuRow:
    tid: int
    vcpu: int | None
    vm: str | None
    count: int     # kvm_exit events on this thread
    events: int    # all kvm events on this thread


@dataclass(frozen=True)
class Summary:
    total_exits: int
    exits: tuple[ReasonRow, ...]
    msr: tuple[AccessRow, ...]
    pio: tuple[AccessRow, ...]
    mmio: tuple[AccessRow, ...]
    vcpus: tuple[VcpuRow, ...]
    userspace_exits: tuple[tuple[str, int], ...] = ()
    unpaired_exits: int = 0
    source: str = "trace"
    approx_percentiles: bool = False   # True when percentiles come from histogram buckets


@dataclass(frozen=True)
class ThreadInfo:
    vcpu: int | None = None
    vm: str | None = None


def pct(part: int, total: int) -> float:
    return round(100.0 * part / total, 2) if total else 0.0


def summarize(paired: Paired, threads: Mapping[int, ThreadInfo] | None = None,
              source: str = "trace") -> Summary:
    """Rows sorted by count (descending), ties by key, so output is deterministic."""
    threads = threads or {}
    total = sum(paired.exit_count.values())
    exits = tuple(
        ReasonRow(reason, pct(n, total), stats(n, paired.exit_lat.get(reason, [])))
        for reason, n in sorted(paired.exit_count.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    by_kind: dict[str, list[AccessRow]] = {"msr": [], "pio": [], "mmio": []}
    for key, n in sorted(paired.access_count.items(), key=lambda kv: (-kv[1], kv[0][1], kv[0][2])):
        by_kind[key[0]].append(AccessRow(key[0], key[1], key[2], stats(n, paired.access_lat.get(key, []))))
    vcpus = []
    for tid in sorted(paired.tid_events):
        info = threads.get(tid, ThreadInfo())
        vcpu = paired.tid_vcpu.get(tid, info.vcpu)
        vcpus.append(VcpuRow(tid, vcpu, info.vm, paired.tid_exits[tid], paired.tid_events[tid]))
    user = tuple(sorted(paired.user_exits.items(), key=lambda kv: (-kv[1], kv[0])))
    return Summary(total, exits, tuple(by_kind["msr"]), tuple(by_kind["pio"]),
                   tuple(by_kind["mmio"]), tuple(vcpus), user, paired.unpaired_exits, source)
