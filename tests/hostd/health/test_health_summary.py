"""What a heartbeat carries: the samples since the last beat, summarised (pure)."""

from __future__ import annotations

import pytest

from hostd.health.signal import Foreign, HostStats
from hostd.health.summary import summarize


def st(at: float, busy: float, **kw) -> HostStats:  # type: ignore[no-untyped-def]
    base = dict(at=at, interval_s=1.0, io_cpus=(0,), io_cpu_busy=busy, cpu_io_service=0.5, cpu_vms=1.0,
                cpu_other=0.2, foreign_threads=0, foreign_kernel_threads=0, foreign_cpu_s=0.0,
                irqs_on_io_cpus_per_s=10.0, psi_some_avg10=None, psi_some_stall=None, throttled_periods=0,
                throttled_ms=0.0)
    return HostStats(**(base | kw))


def test_means_maxima_and_sums() -> None:
    s = summarize([st(1, 0.2, psi_some_avg10=3.0, psi_some_stall=0.1, probe_ok=5, probe_p99_ms=2.0),
                   st(2, 0.6, foreign_threads=3, foreign_kernel_threads=1, foreign_cpu_s=0.4,
                      top_foreign=(Foreign(1, 1, "x", False, 0, 0.4),), throttled_periods=2, probe_ok=5,
                      probe_failed=1, probe_p99_ms=9.0)])
    assert s is not None and s["at"] == 2 and s["samples"] == 2 and s["interval_s"] == 2.0
    assert s["io_cpu_busy"] == pytest.approx(0.4) and s["io_cpu_busy_max"] == 0.6
    assert s["foreign_threads_max"] == 2 and s["foreign_cpu_s"] == 0.4  # user threads only
    assert (s["throttled_periods"], s["probe_ok"], s["probe_failed"], s["probe_p99_ms_max"]) == (2, 10, 1, 9.0)
    assert s["psi_some_avg10_max"] == 3.0 and s["psi_stall"] == pytest.approx(0.1)
    assert summarize([]) is None
