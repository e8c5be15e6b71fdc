"""CSV: one row per exit reason / MSR / port / GPA / vCPU, a `section` column first."""

from __future__ import annotations

import csv
import io

from tools.kvm_utils.render.json import LATENCY_KEYS, to_dict

COLUMNS = ("section", "key", "dir", "name", "count", "pct", *LATENCY_KEYS)


def render(summary) -> str:
    d = to_dict(summary)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in d["exits"]:
        w.writerow(["exit", r["reason"], "", "", r["count"], r["pct"], *_lat(r)])
    for section, key in (("msr", "msr"), ("pio", "port"), ("mmio", "gpa")):
        for r in d[section]:
            w.writerow([section, r[key], r["dir"], r.get("name") or "", r["count"], "", *_lat(r)])
    for r in d["userspace_exits"]:
        w.writerow(["userspace_exit", r["reason"], "", "", r["count"], "", *[""] * 5])
    for r in d["vcpus"]:
        name = f"{r['vm'] or ''}/vcpu{'' if r['vcpu'] is None else r['vcpu']}"
        w.writerow(["vcpu", r["tid"], "", name, r["count"], "", *[""] * 5])
    return out.getvalue()


def _lat(r: dict) -> list:
    return ["" if r[k] is None else r[k] for k in LATENCY_KEYS]
