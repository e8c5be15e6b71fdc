"""What a heartbeat carries: the IO-health samples since the last beat, summarised in
the wire form the scheduler stores (``scheduler/schemas/hosts.py`` ``HostStatsIn``):
means of the rates, maxima of what alarms on peaks, sums of counts."""

from __future__ import annotations

from collections.abc import Sequence

from hostd.health.signal import HostStats


def summarize(samples: Sequence[HostStats]) -> dict | None:
    if not samples:
        return None
    n = len(samples)

    def mean(key: str) -> float:
        return sum(getattr(s, key) for s in samples) / n

    def top(key: str) -> float | None:
        vals = [getattr(s, key) for s in samples if getattr(s, key) is not None]
        return max(vals) if vals else None
    stalls = [s.psi_some_stall for s in samples if s.psi_some_stall is not None]
    return {
        "at": samples[-1].at, "interval_s": sum(s.interval_s for s in samples), "samples": n,
        "io_cpu_busy": mean("io_cpu_busy"), "io_cpu_busy_max": max(s.io_cpu_busy for s in samples),
        "cpu_io_service": mean("cpu_io_service"), "cpu_vms": mean("cpu_vms"), "cpu_other": mean("cpu_other"),
        "foreign_threads_max": max(s.foreign_threads - s.foreign_kernel_threads for s in samples),
        "foreign_cpu_s": sum(s.foreign_cpu_s for s in samples),
        "irqs_per_s": mean("irqs_on_io_cpus_per_s"),
        "psi_some_avg10_max": top("psi_some_avg10"),
        "psi_stall": sum(stalls) / len(stalls) if stalls else None,
        "throttled_periods": sum(s.throttled_periods for s in samples),
        "probe_ok": sum(s.probe_ok for s in samples), "probe_failed": sum(s.probe_failed for s in samples),
        "probe_p99_ms_max": top("probe_p99_ms"),
    }
