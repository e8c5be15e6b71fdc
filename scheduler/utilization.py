"""The fleet's distribution of host CPU use on a day: pure (no I/O).

Each host gives one value per group for the asked window: the share of its CPUs in use
(0..1), by class (the IO service, the VMs, the rest) over the peak window its hostd
folds, or all classes over whole host-local hours. ``distribution`` bins the values
(``bins`` equal bins over 0..1), counts per group, and gives each group's mean, median
and p90 (statistics.quantiles, inclusive).

A share is kept as the exact fraction of two integers (``Share``) and binned in integer
arithmetic (``bin_of``), so a share on a bin edge opens that bin whatever the float
nearest to it: 2.4 of 48 CPUs is 5 %, in 5-10 %, as 5 of 100 is. The peak's CPUs in
use are milli-CPUs (``milli``, rounded once when a host's day is taken), the hours
whole percents. ``repo.days.peak_bins`` bins in the database by the same integers.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import NamedTuple

CLASSES = ("io", "vms", "other")
MILLI = 1000  # the peak's CPUs in use are kept in thousandths of a CPU, hostd's resolution


def milli(cpus: float) -> int:
    """CPUs in use as sent (a JSON number) -> whole milli-CPUs: the decimal the host
    wrote (the float's shortest repr) rounded half to even at the third decimal, the one
    rounding a peak value goes through."""
    return int(Decimal(repr(cpus)).scaleb(3).to_integral_value(ROUND_HALF_EVEN))


class Share(NamedTuple):
    """``used`` of ``total`` (integers, total > 0; used may pass total, capped by ``bin_of``
    and ``value``): milli-CPUs of the host's CPUs x 1000, or percent-hours of 100 x hours."""

    used: int
    total: int

    def value(self) -> float:
        """The float nearest the exact share, at most 1: rounding is monotone and bin
        edges are floats nearest i/bins, so a value never passes its bin's edges."""
        return min(self.used, self.total) / self.total


def bin_of(s: Share, bins: int) -> int:
    """The bin of ``bins`` equal bins over 0..1 holding share ``s``: bin i is
    [i/bins, (i+1)/bins), the last one closed (a share of 1, or over, is in it).
    ``repo.days.peak_bins`` is this in SQL: keep the two alike."""
    return min(bins - 1, s.used * bins // s.total)


@dataclass(frozen=True)
class Day:
    """One host's day as stored (``scheduler/db/models.HostDay``), with what it is grouped by."""

    host: str
    rack: str
    state: str
    policy: str
    cpus: int
    peak: dict[str, int]  # class -> mean milli-CPUs in use over the peak window
    peak_samples: int
    hours: list[int | None]  # per host-local hour: mean whole-host CPU use, percent


def value(d: Day, window: tuple[int, int] | None, cls: str | None) -> Share | None:
    """The host's CPU use share for ``window`` (None: the peak window; else host-local
    hours [start, end)) and ``cls`` (None: all classes). None: no data there."""
    if window is None:
        if d.peak_samples <= 0 or d.cpus <= 0:
            return None
        used = d.peak[cls] if cls else sum(d.peak[c] for c in CLASSES)
        return Share(min(used, d.cpus * MILLI), d.cpus * MILLI)
    return hours_share(d.hours, window)


def hours_share(hours: list[int | None], window: tuple[int, int]) -> Share | None:
    """Whole-host use over host-local hours [start, end) of a day's 24 hourly percents
    (None: an hour without samples), as a share; None when no hour there has data."""
    got = [h for h in hours[window[0]:window[1]] if h is not None]
    return Share(sum(got), 100 * len(got)) if got else None


@dataclass
class Group:
    values: list[float]

    def summary(self) -> dict[str, float | int | None]:
        v = sorted(self.values)
        if not v:
            return {"hosts": 0, "mean": None, "median": None, "p90": None}
        p90 = statistics.quantiles(v, n=10, method="inclusive")[-1] if len(v) > 1 else v[0]
        return {"hosts": len(v), "mean": round(statistics.fmean(v), 4), "median": round(statistics.median(v), 4),
                "p90": round(p90, 4)}


def distribution(days: list[Day], *, window: tuple[int, int] | None, group: str, bins: int,
                 expected: int) -> dict:
    """``group``: class, rack, state or policy. ``expected``: hosts that should have
    reported (the registered fleet); those with no value are counted as missing."""
    groups: dict[str, Group] = {}
    counts: list[dict[str, int]] = [{} for _ in range(bins)]
    seen = 0
    for d in days:
        if group == "class":
            pairs = [(c, value(d, window, c)) for c in CLASSES]
        else:
            pairs = [(getattr(d, group) or "(none)", value(d, window, None))]
        if all(v is None for _, v in pairs):
            continue
        seen += 1
        for g, v in pairs:
            if v is None:
                continue
            groups.setdefault(g, Group([])).values.append(v.value())
            b = bin_of(v, bins)
            counts[b][g] = counts[b].get(g, 0) + 1
    return {"hosts_included": seen, "hosts_missing": max(0, expected - seen),
            "bins": [{"lo": i / bins, "hi": (i + 1) / bins, "counts": counts[i]} for i in range(bins)],
            "groups": {g: grp.summary() for g, grp in sorted(groups.items())}}


def hosts_in_bin(days: list[Day], *, window: tuple[int, int] | None, cls: str | None, bins: int,
                 index: int) -> list[tuple[str, float]]:
    """(host, value) of the hosts whose value falls in bin ``index``, by host name: the
    value unrounded (``Share.value``), so it lies within the bin's edges as floats too."""
    out = []
    for d in days:
        v = value(d, window, cls)
        if v is not None and bin_of(v, bins) == index:
            out.append((d.host, v.value()))
    return sorted(out)
