"""The fleet's utilisation view over the host-day history (``GET /v1/fleet/utilization``)."""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any
from collections.abc import Callable
from urllib.parse import urlencode

from scheduler.db.engine import Store
from scheduler.errors import InvalidRequest
from scheduler.repo import days as days_repo
from scheduler.repo import hosts as host_repo
from scheduler.schemas.fleet import (BinHostsPublic, DayDistribution, HeatmapDay, HeatmapPublic, IoHealthHost,
                                      IoHealthLimits, IoHealthPublic, UtilizationPublic)
from scheduler.utilization import CLASSES, Day, bin_of, distribution, hours_share, hosts_in_bin

HOURS = re.compile(r"^(\d{1,2})-(\d{1,2})$")
MAX_BINS = 100
# The history kept by default (stats.history_days): older days are deleted by
# HostService._expire_days (scheduler/service/hosts.py).
MAX_HEATMAP_DAYS = 400
# The IO-health limits of the alert rules (deploy/prometheus/io-health.rules.yml: probe p99
# over 50 ms, PSI over 10 %), plus foreign CPU over a minute a day and any failed probe:
# what `GET /v1/fleet/io-health` and the console's fleet page check when not told otherwise.
ALERT_LIMITS = IoHealthLimits(probe_p99_ms=50.0, psi_some_avg10=10.0, foreign_cpu_s=60.0, probe_failed=0)


def parse_window(window: str) -> tuple[int, int] | None:
    """"peak" -> None; "HH-HH" -> host-local hours [start, end). InvalidRequest names it."""
    if window == "peak":
        return None
    m = HOURS.match(window)
    if not m:
        raise InvalidRequest(f'{window!r}: "peak" or host-local hours "HH-HH" (e.g. 20-23)', field="window")
    start, end = int(m.group(1)), int(m.group(2))
    if not 0 <= start <= 23 or not 1 <= end <= 24:
        raise InvalidRequest(f"{window!r}: hours are 0-23 (start) and 1-24 (end)", field="window")
    if end <= start:
        raise InvalidRequest(f"{window!r} ends before it starts", field="window")
    return start, end


def _check_bins(bins: int) -> None:
    if not 1 <= bins <= MAX_BINS:
        raise InvalidRequest(f"{bins}: 1..{MAX_BINS} bins", field="bins")


def check_day(day: dt.date, *, now: float, field: str) -> None:
    """InvalidRequest naming ``field`` for a day more than a day ahead of the scheduler's
    UTC date (host-local days run up to 14 h ahead of UTC): a day no host has had yet."""
    today = dt.datetime.fromtimestamp(now, dt.timezone.utc).date()
    if day > today + dt.timedelta(days=1):
        raise InvalidRequest(f"{day} is in the future (the scheduler's date is {today} UTC)", field=field)


class FleetService:
    def __init__(self, *, store: Store, heartbeat_timeout_s: float, clock: Callable[[], float] = time.time,
                 pulse: Any = None):
        self.store = store
        self.pulse = pulse  # service.pulse.Pulse: the shared liveness (None: the rows' alone)
        self.timeout = heartbeat_timeout_s
        self.clock = clock

    def _check_day(self, day: dt.date, field: str) -> str:
        check_day(day, now=self.clock(), field=field)
        return day.isoformat()

    def _days(self, day: str) -> tuple[list[Day], int]:
        now = self.clock()
        with self.store.read() as s:
            rows = days_repo.for_day(session=s, day=day)
        out = []
        for r in rows:
            d = r.HostDay
            if d is None:
                continue
            state = host_repo.effective_state(r, now=now, heartbeat_timeout_s=self.timeout, pulse=self.pulse)
            out.append(Day(r.name, r.rack, state, r.carved_policy or "", d.cpus,
                           {"io": d.peak_io_mcpu, "vms": d.peak_vms_mcpu, "other": d.peak_other_mcpu}, d.peak_samples,
                           days_repo.unpack_hours(d.hours)))
        return out, len(rows)

    def utilization(self, *, day: dt.date, compare: dt.date | None, window: str, group: str,
                    bins: int) -> UtilizationPublic:
        _check_bins(bins)
        span = parse_window(window)
        if group == "class" and span is not None:
            raise InvalidRequest("the split by class is kept for the peak window only: window=peak", field="group")
        first = self._check_day(day, "day")
        second = self._check_day(compare, "compare") if compare else None
        return UtilizationPublic(window=window, group=group, bins=bins,
                                 day=self._distribution(first, span, window, group, bins),
                                 compare=self._distribution(second, span, window, group, bins) if second else None)

    def _distribution(self, day: str, span: tuple[int, int] | None, window: str, group: str,
                      bins: int) -> DayDistribution:
        days, registered = self._days(day)
        got = distribution(days, window=span, group=group, bins=bins, expected=registered)
        for i, b in enumerate(got["bins"]):
            b["hosts"] = "/v1/fleet/utilization/hosts?" + urlencode(
                {"day": day, "window": window, "bins": bins, "bin": i} | ({"class": "all"} if group != "class" else {}))
        return DayDistribution(day=dt.date.fromisoformat(day), **got)

    def heatmap(self, *, day: dt.date, days: int, window: str, bins: int) -> HeatmapPublic:
        """Hosts per bin for each of the ``days`` days ending with ``day``, in one query:
        the peak window binned in the database, an hours window from the packed hours
        (what ``utilization`` with any group but class counts, summed over the groups)."""
        _check_bins(bins)
        if not 1 <= days <= MAX_HEATMAP_DAYS:
            raise InvalidRequest(f"{days}: 1..{MAX_HEATMAP_DAYS} days", field="days")
        span = parse_window(window)
        last = self._check_day(day, "day")
        if (day - dt.date.min).days < days - 1:
            raise InvalidRequest(f"{days} days up to {day} start before year 1", field="days")
        first = (day - dt.timedelta(days=days - 1)).isoformat()
        counts: dict[str, list[int]] = {}
        with self.store.read() as s:
            if span is None:
                for d, b, n in days_repo.peak_bins(session=s, first=first, last=last, bins=bins):
                    counts.setdefault(d, [0] * bins)[int(b)] += n
            else:
                for d, raw in days_repo.hours_between(session=s, first=first, last=last):
                    v = hours_share(days_repo.unpack_hours(raw), span)
                    if v is not None:
                        counts.setdefault(d, [0] * bins)[bin_of(v, bins)] += 1
        out = []
        for i in range(days - 1, -1, -1):
            d = day - dt.timedelta(days=i)
            c = counts.get(d.isoformat(), [0] * bins)
            out.append(HeatmapDay(day=d, counts=c, hosts=sum(c)))
        return HeatmapPublic(window=window, bins=bins, days=out)

    def bin_hosts(self, *, day: dt.date, window: str, bins: int, index: int, cls: str) -> BinHostsPublic:
        _check_bins(bins)
        if not 0 <= index < bins:
            raise InvalidRequest(f"{index}: 0..{bins - 1}", field="bin")
        span = parse_window(window)
        if cls != "all" and (cls not in CLASSES or span is not None):
            raise InvalidRequest(f"{cls!r}: all, or one of {', '.join(CLASSES)} with window=peak", field="class")
        d = self._check_day(day, "day")
        days, _ = self._days(d)
        hosts = hosts_in_bin(days, window=span, cls=None if cls == "all" else cls, bins=bins, index=index)
        return BinHostsPublic(day=day, bin=index, lo=index / bins, hi=(index + 1) / bins,
                              hosts=[{"host": h, "value": v} for h, v in hosts])

    def io_health(self, *, day: dt.date, limits: IoHealthLimits) -> IoHealthPublic:
        """Hosts whose day is over any of ``limits`` (strictly), by host name."""
        d = self._check_day(day, "day")
        with self.store.read() as s:
            rows = days_repo.for_day(session=s, day=d)
        over, checked = [], 0
        for r in rows:
            h = r.HostDay
            if h is None:
                continue
            checked += 1
            names = [name for name, value, limit in (
                ("probe_p99_ms", h.probe_p99_ms_max, limits.probe_p99_ms),
                ("psi_some_avg10", h.psi_some_avg10_max, limits.psi_some_avg10),
                ("foreign_cpu_s", h.foreign_cpu_s, limits.foreign_cpu_s),
                ("probe_failed", h.probe_failed, limits.probe_failed)) if value is not None and value > limit]
            if names:
                over.append(IoHealthHost(host=r.name, rack=r.rack, over=names,
                                         probe_p99_ms_max=_r(h.probe_p99_ms_max),
                                         psi_some_avg10_max=_r(h.psi_some_avg10_max),
                                         foreign_cpu_s=round(h.foreign_cpu_s, 3), probe_failed=h.probe_failed))
        return IoHealthPublic(day=day, limits=limits, hosts_checked=checked, hosts_missing=len(rows) - checked,
                              hosts_over=over)


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)
