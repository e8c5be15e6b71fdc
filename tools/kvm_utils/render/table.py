"""Plain-text tables (perf kvm stat columns plus p50/p99), times in microseconds; and the
kprobe views' documents (`render_view`), counts and nanoseconds as the views keep them."""

from __future__ import annotations

from tools.kvm_utils.aggregate import AccessRow, Bucket, Stats, Summary
from tools.kvm_utils.render.json import is_hist


def _us(v: int | float | None) -> str:
    return "-" if v is None else f"{v / 1000:.2f}"


def _lat_cells(s: Stats) -> list[str]:
    return [_us(s.min_ns), _us(s.p50_ns), _us(s.p99_ns), _us(s.max_ns), _us(s.mean_ns)]


def _fmt(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(  # noqa: E731
        str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return [line(header), *[line(r) for r in rows]]


LAT_HEADER = ["min_us", "p50_us", "p99_us", "max_us", "mean_us"]


def _access_key(r: AccessRow) -> str:
    if r.kind == "msr":
        return f"{hex(r.key)} {r.name}"
    return hex(r.key)


def _access_dir(r: AccessRow) -> str:
    if r.kind == "pio":
        return "OUT" if r.write else "IN"
    return "W" if r.write else "R"


def render(s: Summary) -> str:
    approx = " (percentiles from histogram buckets)" if s.approx_percentiles else ""
    out = [f"source: {s.source}   total exits: {s.total_exits}{approx}", ""]
    if s.exits:
        rows = [[r.reason, str(r.stats.count), f"{r.pct:.2f}", *_lat_cells(r.stats)] for r in s.exits]
        out += _fmt(rows, ["reason", "samples", "samples%", *LAT_HEADER]) + [""]
    for title, rows_ in (("MSR", s.msr), ("PIO port", s.pio), ("MMIO gpa", s.mmio)):
        if rows_:
            rows = [[_access_key(r), _access_dir(r), str(r.stats.count), *_lat_cells(r.stats)] for r in rows_]
            out += _fmt(rows, [title, "dir", "count", *LAT_HEADER]) + [""]
    if s.userspace_exits:
        out += _fmt([[r, str(n)] for r, n in s.userspace_exits], ["userspace exit", "count"]) + [""]
    if s.vcpus:
        rows = [[str(v.tid), v.vm or "-", "-" if v.vcpu is None else str(v.vcpu), str(v.count), str(v.events)]
                for v in s.vcpus]
        out += _fmt(rows, ["tid", "vm", "vcpu", "exits", "events"]) + [""]
    if s.unpaired_exits:
        out.append(f"unpaired exits (no kvm_entry seen): {s.unpaired_exits}")
    return "\n".join(out).rstrip() + "\n"


def _bound(v: int | None) -> str:
    return "..." if v is None else str(v)


def _bucket_row(b: Bucket) -> str:
    return f"  [{_bound(b.lo)}, {_bound(b.hi)}]  {b.count:>10}"


def render_view(doc: dict) -> str:
    """A kprobe view's document (kprobe.view_summary): its probes, what is not shown, then
    each non-empty list of rows as columns and each histogram as `[lo, hi]  count` rows
    (bounds inclusive, `...` for an open end)."""
    out = [f"kprobe {doc['view']}: {doc['duration_s']:.1f} s; probes: "
           + (", ".join(f"{s}" for s in doc["symbols"].values()) or "-")]
    out += [f"  not shown: {x}" for x in doc["lost"]]
    out += [f"  blind: {x}" for x in doc.get("blind", ())]
    for key, rows in doc.items():
        if key in ("lost", "blind") or not isinstance(rows, (list, tuple)) or not rows:
            continue
        out += ["", key]
        if is_hist(rows):
            out += [_bucket_row(b) for b in rows]
            continue
        cols = list(rows[0])
        out.append("  " + "  ".join(f"{c:>14}" for c in cols))
        out += ["  " + "  ".join(f"{str(r[c]) if r[c] is not None else '-':>14}" for c in cols) for r in rows]
    return "\n".join(out) + "\n"
