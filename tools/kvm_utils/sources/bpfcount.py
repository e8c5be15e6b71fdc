"""`exits --engine bpf`: exit counts per reason, thread and event from one BPF program.

Why: kvm_stat's counting design (one perf counter per exit reason on kvm_exit, each with
an `exit_reason==N` filter) makes every exit evaluate every filter. Measured here
(bench/kvm_utils_overhead.py, counters toggled between loops of one VM): 69 filtered
counters (the VMX table) add +8.9 % to a 9.4 us exit, 110 (SVM) +13.2 %: ~12 ns per filter
per exit, several times the 2 % target on a VMX host whose cheap exits take 1-2 us. Here
one program per tracepoint keys a per-CPU hash map by (thread, isa, reason): the cost per
exit is one map update whatever the number of reasons, and the per-vCPU split comes free.

The program prints its maps every interval (`-f json` records on stdout, then a
`kvm-utils-tick` line) and never clears them: bpftrace runs print() and clear() later, in
userspace, and with print+clear a 200,000-exit loop counted 226,441 IO exits and 199,974
kvm_pio. The values are cumulative and `Deltas` turns them into per-interval counts; on
Ctrl-C bpftrace prints them once more. Pure parts (program text, records -> counts) are
separate from the process handling (live.BpfCounters) so both are unit-tested.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from tools.kvm_utils.arch import ISA_TO_VENDOR, exit_reason_name, userspace_exit_name
from tools.kvm_utils.sources import bpfwindow
from tools.kvm_utils.sources.bpftrace_output import int_maps, parse

#: the printf line that ends one interval's map records
TICK = "kvm-utils-tick"


def count_script(events: Iterable[str], interval_s: float, pids: Iterable[int] = (),
                 duration: float | None = None) -> str:
    """The counting program. `events`: kvm tracepoints counted whole (@ev's index is the
    position in this list);
    `pids`: only these VM processes (empty: every thread)."""
    pids = sorted(set(int(p) for p in pids))
    guard = ("if (" + " && ".join(f"pid != {p}" for p in pids) + ") { return; } ") if pids else ""
    parts = [bpfwindow.begin(),
             f"tracepoint:kvm:kvm_exit {{ {guard}@x[tid, args->isa, args->exit_reason] = count(); }}",
             # errno < 0: KVM_RUN failed (EINTR...), the reason field is stale: not an exit
             f"tracepoint:kvm:kvm_userspace_exit /args->errno >= 0/ {{ {guard}@u[tid, args->reason] = count(); }}"]
    parts += [f"tracepoint:kvm:{e} {{ {guard}@ev[tid, {i}] = count(); }}" for i, e in enumerate(events)]
    ms = max(1, int(interval_s * 1000))
    parts.append(f'interval:ms:{ms} {{ print(@x); print(@u); print(@ev); printf("{TICK}\\n"); }}')
    parts += bpfwindow.stop(duration)
    parts.append(f"END {{ {bpfwindow.CLEAR} }}")
    return "\n".join(parts) + "\n"


def parse_record(line: str) -> tuple[str, dict[tuple[int, ...], int]] | str | None:
    """One `bpftrace -f json` line -> ("x"|"u"|"ev", {key: count}) for a map, "tick" for the
    end of an interval, None for anything else (read by bpftrace_output, as every engine's)."""
    out = parse(line)
    if TICK in out.lines:
        return "tick"
    for name, values in int_maps(out).items():
        return name, values
    return None


class Deltas:
    """Cumulative map values, as the program prints them, -> what changed since the last
    call (per map and key)."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, tuple[int, ...]], int] = {}

    def __call__(self, maps: dict[str, dict[tuple[int, ...], int]]) -> dict[str, dict[tuple[int, ...], int]]:
        out: dict[str, dict[tuple[int, ...], int]] = {}
        for name, values in maps.items():
            for key, v in values.items():
                d = v - self.last.get((name, key), 0)
                if d > 0:
                    out.setdefault(name, {})[key] = d
                self.last[(name, key)] = max(v, self.last.get((name, key), 0))
        return out


def to_counts(maps: dict[str, dict[tuple[int, ...], int]], events: list[str],
              target_of: Callable[[int], object], spec: Callable[[str, str], object]) -> Counter:
    """Pure: one interval's maps -> Counter keyed (target, spec) as the perf engine's delta.
    `target_of(tid)` names the thread; `spec(kind, label)` makes the counter key."""
    out: Counter = Counter()
    for (tid, isa, code), n in maps.get("x", {}).items():
        out[(target_of(tid), spec("exit", exit_reason_name(ISA_TO_VENDOR.get(isa), code)))] += n
    for (tid, code), n in maps.get("u", {}).items():
        out[(target_of(tid), spec("user", userspace_exit_name(code)))] += n
    for (tid, i), n in maps.get("ev", {}).items():
        label = events[i] if 0 <= i < len(events) else f"event{i}"
        out[(target_of(tid), spec("event", label))] += n
    return out


def thread_targets(proc: Path, make: Callable[[int, str, int | None, int | None], object]) -> Callable[[int], object]:
    """tid -> target, from /proc once per thread (vCPU index, VM name, process id); threads
    that are gone or are not vCPU threads still get a target of their own."""
    from tools.kvm_utils.procs import tgid_of, thread_info
    cache: dict[int, object] = {}

    def target_of(tid: int) -> object:
        if tid not in cache:
            info = thread_info(proc, tid)
            cache[tid] = make(tid, (info.vm if info else None) or f"tid{tid}", info.vcpu if info else None,
                              tgid_of(proc, tid))
        return cache[tid]
    return target_of
