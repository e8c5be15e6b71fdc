"""The stable JSON interface (see README "JSON schema"); extra keys are additive only."""

from __future__ import annotations

import json
from typing import Any

from tools.kvm_utils.aggregate import AccessRow, Stats, Summary

LATENCY_KEYS = ("min_ns", "p50_ns", "p99_ns", "max_ns", "mean_ns")


def _lat(s: Stats) -> dict[str, Any]:
    return {k: getattr(s, k) for k in LATENCY_KEYS}


def _hist(s: Stats) -> list[dict[str, int]]:
    return [{"lo_ns": b.lo, "hi_ns": b.hi, "count": b.count} for b in s.hist]


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
                   "hist": _hist(r.stats)} for r in s.exits],
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
