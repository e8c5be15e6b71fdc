"""The host's days, folded from its IO-health samples: what the scheduler keeps of each
host-local day for the fleet's utilisation view (``POST /v1/hosts/{name}/days``, the
wire form of ``scheduler/schemas/fleet.py`` ``HostDayIn``), under 256 bytes stored.

Per host-local day: the mean CPUs in use by class (the IO service, the VMs, the rest)
over the peak window (default 21:00-22:00, the evening peak), the mean whole-host CPU
use per hour (percent), a 20-bin histogram of the day's samples of whole-host CPU use,
and the IO-health figures a rollout's gate reads (the probe's worst p99, the worst PSI,
foreign CPU seconds, failed probes). A sample counts towards the day and hour its end
falls in, in the host's local time (``utc_offset``: the offset at that instant, so a
daylight-saving change moves the hours with the wall clock).

The fold keeps today and yesterday (yesterday's last summary is sent once more after
midnight) and can be saved and loaded (``to_json``/``from_json``), so a hostd restart
loses only the samples of its own downtime.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from hostd.health.signal import HostStats

BINS = 20
HOURS = 24


def local_offset_min(at: float) -> int:
    """This machine's UTC offset at ``at``, in minutes (time zone rules of the host)."""
    return round(time.localtime(at).tm_gmtoff / 60)


def parse_window(text: str) -> tuple[int, int]:
    """"21:00-22:00" -> (start, end) in minutes of the day; ValueError unless start < end."""
    a, _, b = text.partition("-")
    start, end = (int(x.split(":")[0]) * 60 + int(x.split(":")[1]) for x in (a, b))
    if not 0 <= start < end <= 24 * 60:
        raise ValueError(f"{text!r}: HH:MM-HH:MM within a day, the end after the start")
    return start, end


@dataclass
class _Day:
    day: str
    utc_offset_min: int
    samples: int = 0
    hour_sum: list[float] = field(default_factory=lambda: [0.0] * HOURS)
    hour_n: list[int] = field(default_factory=lambda: [0] * HOURS)
    hist: list[int] = field(default_factory=lambda: [0] * BINS)
    peak_n: int = 0
    peak_io: float = 0.0
    peak_vms: float = 0.0
    peak_other: float = 0.0
    probe_p99_ms_max: float | None = None
    psi_some_avg10_max: float | None = None
    foreign_cpu_s: float = 0.0
    probe_failed: int = 0


class DayFold:
    def __init__(self, cpus: int, *, peak: str = "21:00-22:00",
                 offset: Callable[[float], int] = local_offset_min):
        self.cpus = max(1, cpus)
        self.peak = peak
        self._peak = parse_window(peak)
        self.offset = offset
        self.days: dict[str, _Day] = {}

    def add(self, samples: Iterable[HostStats]) -> None:
        for s in samples:
            off = self.offset(s.at)
            local = dt.datetime.fromtimestamp(s.at, dt.timezone.utc) + dt.timedelta(minutes=off)
            key = local.date().isoformat()
            d = self.days.get(key)
            if d is None:
                d = self.days[key] = _Day(key, off)
                for old in sorted(self.days)[:-2]:  # today and yesterday
                    del self.days[old]
            used = s.cpu_io_service + s.cpu_vms + s.cpu_other
            share = min(1.0, used / self.cpus)
            d.samples += 1
            d.hour_sum[local.hour] += share
            d.hour_n[local.hour] += 1
            d.hist[min(BINS - 1, int(share * BINS))] += 1
            minute = local.hour * 60 + local.minute
            if self._peak[0] <= minute < self._peak[1]:
                d.peak_n += 1
                d.peak_io += s.cpu_io_service
                d.peak_vms += s.cpu_vms
                d.peak_other += s.cpu_other
            if s.probe_p99_ms is not None:
                d.probe_p99_ms_max = max(d.probe_p99_ms_max or 0.0, s.probe_p99_ms)
            if s.psi_some_avg10 is not None:
                d.psi_some_avg10_max = max(d.psi_some_avg10_max or 0.0, s.psi_some_avg10)
            d.foreign_cpu_s += s.foreign_cpu_s
            d.probe_failed += s.probe_failed

    def summaries(self) -> list[dict]:
        """Yesterday's (if kept) and today's, oldest first, in the scheduler's wire form."""
        out = []
        for key in sorted(self.days):
            d = self.days[key]
            n = max(1, d.peak_n)
            start, end = self.peak.split("-")
            out.append({
                "day": d.day, "utc_offset_min": d.utc_offset_min, "cpus": self.cpus, "samples": d.samples,
                "peak": {"start": start, "end": end, "samples": d.peak_n, "io": round(d.peak_io / n, 3),
                         "vms": round(d.peak_vms / n, 3), "other": round(d.peak_other / n, 3)},
                "hours": [round(100 * d.hour_sum[h] / d.hour_n[h]) if d.hour_n[h] else None for h in range(HOURS)],
                "hist": d.hist, "probe_p99_ms_max": d.probe_p99_ms_max,
                "psi_some_avg10_max": d.psi_some_avg10_max, "foreign_cpu_s": round(d.foreign_cpu_s, 3),
                "probe_failed": d.probe_failed})
        return out

    def to_json(self) -> str:
        return json.dumps({"cpus": self.cpus, "peak": self.peak, "days": [asdict(d) for d in self.days.values()]})

    def load(self, text: str) -> None:
        """Days saved by ``to_json`` (another peak window or CPU count: ignored, the fold
        starts afresh rather than mixing two definitions in one day)."""
        got = json.loads(text)
        if got.get("cpus") != self.cpus or got.get("peak") != self.peak:
            return
        self.days = {d["day"]: _Day(**d) for d in got.get("days", [])}
