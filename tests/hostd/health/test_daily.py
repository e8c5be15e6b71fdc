"""The host's days folded from its samples (hostd/health/daily.py), as the scheduler
takes them (scheduler/schemas/fleet.py HostDayIn: the contract is checked here)."""

from __future__ import annotations

import datetime as dt

import pytest

from hostd.health.daily import DayFold, parse_window
from hostd.health.signal import HostStats
from scheduler.schemas.fleet import HostDayIn

UTC8 = lambda at: 480  # noqa: E731 - a host 8 hours east of UTC
MIDNIGHT = dt.datetime(2026, 11, 24, 16, 0, tzinfo=dt.timezone.utc).timestamp()  # 2026-11-25 00:00 at UTC+8


def sample(at: float, io: float, vms: float, other: float, **kw) -> HostStats:  # type: ignore[no-untyped-def]
    base = dict(at=at, interval_s=60.0, io_cpus=(0,), io_cpu_busy=0.5, cpu_io_service=io, cpu_vms=vms,
                cpu_other=other, foreign_threads=0, foreign_kernel_threads=0, foreign_cpu_s=0.0,
                irqs_on_io_cpus_per_s=0.0, psi_some_avg10=None, psi_some_stall=None, throttled_periods=0,
                throttled_ms=0.0)
    return HostStats(**(base | kw))


def test_a_day_by_hour_by_bin_and_the_peak_by_class() -> None:
    fold = DayFold(16, offset=UTC8)
    # 20:00-23:00 host-local, a sample a minute: 4 CPUs at 20h, 8 at 21h (peak), 12 at 22h
    for h, (io, vms) in {20: (1.0, 3.0), 21: (2.0, 6.0), 22: (2.0, 10.0)}.items():
        fold.add(sample(MIDNIGHT + h * 3600 + m * 60 + 30, io, vms, 0.0, probe_p99_ms=h / 10,
                        psi_some_avg10=float(h), foreign_cpu_s=0.01, probe_failed=1 if m == 0 else 0)
                 for m in range(60))
    [d] = fold.summaries()
    assert d["day"] == "2026-11-25" and d["utc_offset_min"] == 480 and d["cpus"] == 16 and d["samples"] == 180
    assert d["peak"] == {"start": "21:00", "end": "22:00", "samples": 60, "io": 2.0, "vms": 6.0, "other": 0.0}
    assert d["hours"][19:24] == [None, 25, 50, 75, None]
    assert d["hist"][5] == 60 and d["hist"][10] == 60 and d["hist"][15] == 60 and sum(d["hist"]) == 180
    assert (d["probe_p99_ms_max"], d["psi_some_avg10_max"], d["probe_failed"]) == (2.2, 22.0, 3)
    assert d["foreign_cpu_s"] == pytest.approx(1.8)
    HostDayIn.model_validate(d)  # what the scheduler takes


def test_two_days_are_kept_and_the_oldest_goes() -> None:
    fold = DayFold(4, offset=UTC8)
    for day in range(3):
        fold.add([sample(MIDNIGHT + day * 86400 + 3600, 0.5, 1.0, 0.5)])
    assert [d["day"] for d in fold.summaries()] == ["2026-11-26", "2026-11-27"]


def test_saved_days_come_back_unless_the_definition_changed() -> None:
    fold = DayFold(8, offset=UTC8)
    fold.add([sample(MIDNIGHT + 100, 1.0, 1.0, 0.0)])
    again = DayFold(8, offset=UTC8)
    again.load(fold.to_json())
    assert again.summaries() == fold.summaries()
    other = DayFold(8, peak="20:00-21:00", offset=UTC8)
    other.load(fold.to_json())
    assert other.summaries() == []


@pytest.mark.parametrize("bad", ["22:00-21:00", "21:00", "25:00-26:00", "x-y"])
def test_a_bad_peak_window_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_window(bad)


def test_a_bad_peak_window_in_the_config_names_the_key(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from hostd.config import load_config
    from hostd.errors import ConfigError
    p = tmp_path / "hostd.toml"
    p.write_text('peak_window = "22:00-21:00"\n')
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.field == "peak_window"
