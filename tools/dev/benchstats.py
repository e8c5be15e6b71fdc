"""Statistics the benches share: a median with a distribution-free confidence interval,
and the verdict of an interval against a target."""

from __future__ import annotations

import math
import statistics


def median_ci(xs: list[float], z: float = 1.96) -> tuple[float, float, float]:
    """Median and a distribution-free ~95 % confidence interval for it (order statistics:
    ranks n/2 -+ z*sqrt(n)/2, normal approximation of the binomial)."""
    s = sorted(xs)
    n = len(s)
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    return statistics.median(s), s[lo], s[hi]


def verdict(lo: float, hi: float, target: float | None) -> str:
    if target is None:
        return ""
    return f"< {target:g} %: " + ("met" if hi < target else "exceeded" if lo > target else "inconclusive")
