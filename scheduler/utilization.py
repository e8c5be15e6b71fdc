"""The fleet's distribution of host CPU use on a day: pure (no I/O).

Each host gives one value per group for the asked window: the share of its CPUs in use
(0..1), by class (the IO service, the VMs, the rest) over the peak window its hostd
folds, or all classes over whole host-local hours. ``distribution`` bins the values
(``bins`` equal bins over 0..1; a value of exactly 1 falls in the last), counts per
group, and gives each group's mean, median and p90 (statistics.quantiles, inclusive).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

CLASSES = ("io", "vms", "other")


@dataclass(frozen=True)
class Day:
    """One host's day as stored (``scheduler/db/models.HostDay``), with what it is grouped by."""

    host: str
    rack: str
    state: str
    policy: str
    cpus: int
    peak: dict[str, float]  # class -> mean CPUs in use over the peak window
    peak_samples: int
    hours: list[int | None]  # per host-local hour: mean whole-host CPU use, percent


def value(d: Day, window: tuple[int, int] | None, cls: str | None) -> float | None:
    """The host's CPU use share for ``window`` (None: the peak window; else host-local
    hours [start, end)) and ``cls`` (None: all classes). None: no data there."""
    if window is None:
        if d.peak_samples <= 0 or d.cpus <= 0:
            return None
        used = d.peak[cls] if cls else sum(d.peak[c] for c in CLASSES)
        return min(1.0, used / d.cpus)
    return hours_share(d.hours, window)


def hours_share(hours: list[int | None], window: tuple[int, int]) -> float | None:
    """Whole-host use over host-local hours [start, end) of a day's 24 hourly percents
    (None: an hour without samples), as a share; None when no hour there has data."""
    got = [h for h in hours[window[0]:window[1]] if h is not None]
    return sum(got) / len(got) / 100 if got else None


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


def bin_of(v: float, bins: int) -> int:
    return min(bins - 1, int(v * bins))


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
            groups.setdefault(g, Group([])).values.append(v)
            b = bin_of(v, bins)
            counts[b][g] = counts[b].get(g, 0) + 1
    return {"hosts_included": seen, "hosts_missing": max(0, expected - seen),
            "bins": [{"lo": round(i / bins, 6), "hi": round((i + 1) / bins, 6), "counts": counts[i]}
                     for i in range(bins)],
            "groups": {g: grp.summary() for g, grp in sorted(groups.items())}}


def hosts_in_bin(days: list[Day], *, window: tuple[int, int] | None, cls: str | None, bins: int,
                 index: int) -> list[tuple[str, float]]:
    """(host, value) of the hosts whose value falls in bin ``index``, by host name."""
    out = []
    for d in days:
        v = value(d, window, cls)
        if v is not None and bin_of(v, bins) == index:
            out.append((d.host, round(v, 4)))
    return sorted(out)
