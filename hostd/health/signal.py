"""Two samples of a host -> how disturbed the IO service was between them (pure).

The signal, per interval:
- ``io_cpu_busy``: how busy ``io_cpus`` were (fraction of their capacity);
- ``cpu_io_service`` / ``cpu_vms`` / ``cpu_other``: CPU used by class, in cores;
- ``foreign_threads`` (and how many were kernel threads), ``foreign_cpu_s``: threads that
  are not the IO service's and ran on ``io_cpus`` (their last CPU is one of them and they
  used CPU in the interval; ``/proc`` keeps the last CPU only, so a thread that moved in
  and out between two samples is missed or counted whole: the scan is a cheap, sampled
  view, exact for pinned threads);
- ``irqs_on_io_cpus_per_s``: interrupts delivered to ``io_cpus`` (``/proc/interrupts``);
- ``psi_some_avg10`` and ``psi_some_stall``: CPU pressure (the IO service's cgroup on v2,
  the whole host where only ``/proc/pressure/cpu`` exists), the stall as a fraction of
  wall time;
- ``throttled_periods`` and ``throttled_ms``: CFS quota throttling of the IO service.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache

from hostd.health.readers import CpuTime, Psi, Thread, Throttle

TOP = 5


@cache
def clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    mono: float  # time.monotonic() when taken
    wall: float  # time.time()
    cpu: dict[int, CpuTime]
    irqs: dict[str, tuple[tuple[int, ...], str]]
    threads: dict[int, Thread]
    io_tids: frozenset[int]
    vm_tids: frozenset[int]
    psi: Psi | None = None
    throttle: Throttle | None = None


@dataclass(frozen=True)
class Foreign:
    pid: int
    tid: int
    comm: str
    kthread: bool
    cpu: int
    cpu_s: float


@dataclass(frozen=True)
class Irq:
    irq: str
    name: str
    per_s: float


@dataclass(frozen=True)
class HostStats:
    at: float  # unix time of the later sample
    interval_s: float
    io_cpus: tuple[int, ...]
    io_cpu_busy: float
    cpu_io_service: float
    cpu_vms: float
    cpu_other: float
    foreign_threads: int
    foreign_kernel_threads: int
    foreign_cpu_s: float
    irqs_on_io_cpus_per_s: float
    psi_some_avg10: float | None
    psi_some_stall: float | None
    throttled_periods: int
    throttled_ms: float
    top_foreign: tuple[Foreign, ...] = ()
    top_irqs: tuple[Irq, ...] = ()
    # the active probe of the IO service, over the same interval (hostd/health/probe.py)
    probe_ok: int = 0
    probe_failed: int = 0
    probe_p50_ms: float | None = None
    probe_p99_ms: float | None = None
    extra: dict[str, float] = field(default_factory=dict)
    # the part of foreign_cpu_s used by kernel threads (per-CPU ones cannot be moved off
    # io_cpus; a gate on what a carve can change leaves them out)
    foreign_kernel_cpu_s: float = 0.0


def diff(a: Sample, b: Sample, io_cpus: tuple[int, ...]) -> HostStats:
    """What happened between samples ``a`` and ``b`` (b later)."""
    dt = max(b.mono - a.mono, 1e-9)
    hz = clock_ticks()
    io = set(io_cpus)
    busy = total = 0
    for c in io:
        if c in a.cpu and c in b.cpu:
            busy += b.cpu[c].busy - a.cpu[c].busy
            total += b.cpu[c].total - a.cpu[c].total
    by_class = {"io": 0, "vm": 0, "other": 0}
    foreign: list[Foreign] = []
    for tid, t in b.threads.items():
        before = a.threads.get(tid)
        used = t.ticks - (before.ticks if before and before.pid == t.pid else 0)
        if used <= 0:
            continue
        cls = "io" if tid in b.io_tids else "vm" if tid in b.vm_tids else "other"
        by_class[cls] += used
        if cls != "io" and t.cpu in io:
            foreign.append(Foreign(t.pid, tid, t.comm, t.kthread, t.cpu, used / hz))
    irq_rate: list[Irq] = []
    for irq, (counts, name) in b.irqs.items():
        before = a.irqs.get(irq, ((), ""))[0]
        n = sum(counts[c] - (before[c] if c < len(before) else 0) for c in io if c < len(counts))
        if n > 0:
            irq_rate.append(Irq(irq, name, n / dt))
    foreign.sort(key=lambda f: (-f.cpu_s, f.tid))
    irq_rate.sort(key=lambda i: (-i.per_s, i.irq))
    psi_stall = None
    if a.psi and b.psi:
        psi_stall = max(0, b.psi.some_total_us - a.psi.some_total_us) / 1e6 / dt
    thr_n, thr_ms = 0, 0.0
    if a.throttle and b.throttle:
        thr_n = max(0, b.throttle.throttled - a.throttle.throttled)
        thr_ms = max(0, b.throttle.throttled_us - a.throttle.throttled_us) / 1000
    return HostStats(
        at=b.wall, interval_s=dt, io_cpus=tuple(sorted(io)), io_cpu_busy=busy / total if total else 0.0,
        cpu_io_service=by_class["io"] / hz / dt, cpu_vms=by_class["vm"] / hz / dt,
        cpu_other=by_class["other"] / hz / dt, foreign_threads=len(foreign),
        foreign_kernel_threads=sum(1 for f in foreign if f.kthread),
        foreign_cpu_s=sum(f.cpu_s for f in foreign), irqs_on_io_cpus_per_s=sum(i.per_s for i in irq_rate),
        psi_some_avg10=b.psi.some_avg10 if b.psi else None, psi_some_stall=psi_stall,
        throttled_periods=thr_n, throttled_ms=thr_ms, top_foreign=tuple(foreign[:TOP]),
        top_irqs=tuple(irq_rate[:TOP]), foreign_kernel_cpu_s=sum(f.cpu_s for f in foreign if f.kthread))
