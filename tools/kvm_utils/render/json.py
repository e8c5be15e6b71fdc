"""The stable JSON interface (see README "JSON schema"); extra keys are additive only.
Also the kprobe views' documents (`render_view`), whose histograms are written the same way."""

from __future__ import annotations

import json
from typing import Any

from tools.kvm_utils.aggregate import AccessRow, Bucket, Stats, Summary

LATENCY_KEYS = ("min_ns", "p50_ns", "p99_ns", "max_ns", "mean_ns")


def _lat(s: Stats) -> dict[str, Any]:
    return {k: getattr(s, k) for k in LATENCY_KEYS}


def hist(buckets: tuple[Bucket, ...]) -> list[dict[str, int | None]]:
    """Histogram buckets as JSON: bounds inclusive (aggregate.Bucket), null for an open end."""
    return [{"lo_ns": b.lo, "hi_ns": b.hi, "count": b.count} for b in buckets]


def _access(row: AccessRow) -> dict[str, Any]:
    if row.kind == "msr":
        head = {"msr": hex(row.key), "dir": "W" if row.write else "R", "name": row.name}
    elif row.kind == "pio":
        head = {"port": hex(row.key), "dir": "OUT" if row.write else "IN"}
    else:
        head = {"gpa": hex(row.key), "dir": "W" if row.write else "R"}
    return {**head, "count": row.stats.count, **_lat(row.stats)}


def to_dict(s: Summary) -> dict[str, Any]:
    return {
        "total_exits": s.total_exits,
        "exits": [{"reason": r.reason, "count": r.stats.count, "pct": r.pct, **_lat(r.stats),
                   "hist": hist(r.stats.hist)} for r in s.exits],
        "msr": [_access(r) for r in s.msr],
        "pio": [_access(r) for r in s.pio],
        "mmio": [_access(r) for r in s.mmio],
        "vcpus": [{"tid": v.tid, "vcpu": v.vcpu, "vm": v.vm, "count": v.count, "events": v.events}
                  for v in s.vcpus],
        "userspace_exits": [{"reason": r, "count": n} for r, n in s.userspace_exits],
        "unpaired_exits": s.unpaired_exits,
        "source": s.source,
        "approx_percentiles": s.approx_percentiles,
    }


def render(s: Summary) -> str:
    return json.dumps(to_dict(s), indent=2) + "\n"


def is_hist(value: object) -> bool:
    """A kprobe view document's histogram: a tuple of Buckets (its rows are lists)."""
    return isinstance(value, tuple) and all(isinstance(b, Bucket) for b in value)


def view_to_dict(doc: dict[str, Any]) -> dict[str, Any]:
    """A kprobe view's document (kprobe.view_summary) -> its JSON object."""
    return {k: hist(v) if is_hist(v) else v for k, v in doc.items()}


def render_view(doc: dict[str, Any]) -> str:
    return json.dumps(view_to_dict(doc), indent=2) + "\n"
