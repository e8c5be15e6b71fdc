"""``hybctl fleet``: the answer of ``GET /v1/fleet/utilization`` drawn in a terminal.

One row per bin (5 % wide by default), one column per group (class, rack, state or
policy); each cell a bar of the hosts in that bin and their count. With a compared day,
a second, lighter bar under the first. The totals (hosts included, missing) and each
group's mean, median and p90 are printed under the bars: the numbers are the API's,
unchanged; only the bars are drawn here."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

EIGHTHS = " ▏▎▍▌▋▊▉"
WIDTH = 24  # characters of the longest bar
STYLES = {"day": "bold cyan", "compare": "grey62"}


def bar(n: int, top: int, width: int = WIDTH) -> str:
    """``n`` of ``top`` as a bar of ``width`` characters with eighth-block resolution;
    any n > 0 shows at least a sliver."""
    if n <= 0 or top <= 0:
        return ""
    eighths = max(1, round(n / top * width * 8))
    return "█" * (eighths // 8) + (EIGHTHS[eighths % 8] if eighths % 8 else "")


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f} %"


def bar_width(columns: int, groups: int, top: int) -> int:
    """The longest bar that lets every group's column (bar, space, count) fit beside the
    bin labels in ``columns`` characters: a narrow terminal gets shorter bars, never cut
    ones."""
    label, count = 10, len(str(top)) + 3
    return max(4, min(WIDTH, (columns - label) // max(1, groups) - count))


def render(u: dict, columns: int = 200) -> Group:
    days = [("day", u["day"])] + ([("compare", u["compare"])] if u.get("compare") else [])
    groups = sorted({g for _, d in days for b in d["bins"] for g in b["counts"]} |
                    {g for _, d in days for g in d["groups"]})
    top = max([n for _, d in days for b in d["bins"] for n in b["counts"].values()] or [0])
    width = bar_width(columns, len(groups), top)
    window = "the peak window" if u["window"] == "peak" else f"host-local hours {u['window']}"
    head = Text.assemble(("Host CPU use across the fleet", "bold"), f", {window}, by {u['group']}\n")
    for key, d in days:
        head.append(f"{d['day']}", STYLES[key])
        head.append(f": {d['hosts_included']} hosts included, {d['hosts_missing']} missing (no data)"
                    + (" (first bar)\n" if key == "day" and len(days) > 1 else " (second bar)\n" if key == "compare"
                       else "\n"))
    t = Table(box=None, header_style="bold", pad_edge=False)
    t.add_column("CPU use", justify="right", no_wrap=True, min_width=8)
    for g in groups or ["(no hosts)"]:
        t.add_column(g, no_wrap=True)
    for i, b in enumerate(days[0][1]["bins"]):
        cells = []
        for g in groups:
            lines = Text()
            for j, (key, d) in enumerate(days):
                n = d["bins"][i]["counts"].get(g, 0)
                if j:
                    lines.append("\n")
                lines.append(bar(n, top, width), STYLES[key])
                lines.append(f" {n}" if n else "")
            cells.append(lines)
        t.add_row(f"{b['lo'] * 100:.0f}-{b['hi'] * 100:.0f} %", *cells)
    stats = Table(box=None, header_style="bold", pad_edge=False)
    for h in ("day", u["group"], "hosts", "mean", "median", "p90"):
        stats.add_column(h, justify="left" if h in ("day", u["group"]) else "right")
    for key, d in days:
        for g in groups:
            s = d["groups"].get(g)
            if s:
                stats.add_row(Text(str(d["day"]), STYLES[key]), g, str(s["hosts"]), pct(s["mean"]),
                              pct(s["median"]), pct(s["p90"]))
    parts: list = [head, t, Text(""), stats]
    if days[0][1]["hosts_included"] == 0:
        parts.append(Text(f"\nNo host has data for {days[0][1]['day']} in {window}: hostd sends its day every "
                          "few minutes; try --window 0-24 for today's hours so far, or another --day.", "yellow"))
    return Group(*parts)
