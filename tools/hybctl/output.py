"""What hybctl prints: ``-o table`` (the default), ``wide`` (more columns), ``json`` and
``yaml`` (the API's answer as it came, for scripts and ``jq``).

Text from the API is data, never terminal markup: the consoles hybctl prints on read no
rich markup or emoji codes (hybctl styles its own words with ``Text`` and table styles),
and a table shows a string's control characters as escapes (``\x1b``), so a rack name
cannot move the cursor, open a hyperlink or break a row in two."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import yaml
from rich.console import Console, ConsoleDimensions, Group, RenderableType
from rich.table import Table
from rich.text import Text


class Format(str, Enum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


@dataclass(frozen=True)
class Column:
    header: str
    get: Callable[[dict], Any]
    wide_only: bool = False


def age(ts: float | None, now: float | None = None) -> str:
    """kubectl's AGE: the largest unit or two (``45s``, ``3m10s``, ``5h``, ``12d``)."""
    if not ts:
        return "-"
    s = max(0, int((now or time.time()) - ts))
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s < 600 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60}m" if s < 36000 else f"{s // 3600}h"
    return f"{s // 86400}d"


def when(ts: float | None) -> str:
    if not ts:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


# C0 and C1 controls (ESC, CSI, newline, ...) and the bidi overrides that reorder a line
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible(s: str) -> str:
    """``s`` with what a terminal would act on instead of show written as escapes."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), s)


def visible_data(v: Any) -> Any:
    """An API answer with every string, keys included, passed through ``visible``: what
    a table or a line of hybctl's is drawn from."""
    if isinstance(v, str):
        return visible(v)
    if isinstance(v, dict):
        return {visible_data(k): visible_data(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [visible_data(x) for x in v]
    return v


class _Console(Console):
    """Written to a pipe or a file (whatever the file is when it prints), a table is as
    wide as its values, as kubectl's: the 80 columns rich assumes there would cut cells
    short ("…"), and what a script reads would not be the API's data. ``COLUMNS`` is a
    terminal's width and is not read there; a width given by the caller is kept."""

    def __init__(self, *, width: int | None = None, **kw: Any) -> None:
        super().__init__(width=width, **kw)
        self._given_width = width

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self.is_terminal or self._given_width is not None:
            return size
        return ConsoleDimensions(1 << 16, size.height)


def console(*, stderr: bool = False, width: int | None = None) -> Console:
    """A console that prints strings as they are: no markup, no emoji codes, no
    highlighting of numbers or URLs in the API's text."""
    return _Console(stderr=stderr, width=width, soft_wrap=False, markup=False, emoji=False, highlight=False)


def pages(v: list[dict]) -> str:
    """Hugepages as placed: ``512x2048K@0`` (count x size on NUMA node)."""
    return ", ".join(f"{h.get('count', '')}x{h.get('size_kb', '')}K@{h.get('node', '')}" for h in v) or "-"


def vfs(v: list[dict]) -> str:
    """VFs as placed: ``ens1f0#3 max 500 Mb/s``."""
    return ", ".join(f"{f.get('pf', '')}#{f.get('index', '')}"
                     + (f" max {f['max_tx_rate_mbps']} Mb/s" if f.get("max_tx_rate_mbps") else "")
                     + (f" min {f['min_tx_rate_mbps']} Mb/s" if f.get("min_tx_rate_mbps") else "") for f in v) or "-"


def disks(v: list[dict]) -> str:
    """Disks as placed: ``nvme1n1 (500 IOPS, 0 B/s)``; 0: not throttled."""
    return ", ".join(f"{d.get('name', '')} ({d.get('iops', 0)} IOPS, {d.get('bytes_sec', 0)} B/s)" for d in v) or "-"


def cell(v: Any) -> str:
    """A value in one table cell: a list joined by commas (by semicolons when it holds
    mappings), a mapping as ``k=v k=v``; never Python's repr."""
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, tuple)):
        sep = "; " if any(isinstance(x, dict) for x in v) else ","
        return sep.join(cell(x) if isinstance(x, (dict, list, tuple)) else str(x) for x in v) or "-"
    if isinstance(v, dict):
        return " ".join(f"{k}={cell(x)}" for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))) or "-"
    return str(v)


def titled(title: str, t: RenderableType) -> Group:
    """A title line over a table (a rich table's own title wraps at the table's width)."""
    return Group(Text(title, style="bold"), t)


def grid(*headers: str) -> Table:
    """An empty table as hybctl draws them: no box, bold headers."""
    t = Table(box=None, header_style="bold", pad_edge=False)
    for h in headers:
        t.add_column(h)
    return t


def table(rows: Sequence[dict], columns: Sequence[Column], fmt: Format, title: str | None = None) -> RenderableType:
    cols = [c for c in columns if fmt is Format.wide or not c.wide_only]
    t = Table(box=None, header_style="bold", pad_edge=False)
    for c in cols:
        t.add_column(c.header)
    for r in rows:
        t.add_row(*(cell(c.get(r)) for c in cols), end_section=False)
    return titled(title, t) if title else t


def dump(data: Any, fmt: Format) -> str:
    if fmt is Format.yaml:
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip("\n")
    return json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False)


def printer(console: Console, fmt: Format) -> Callable[[Any, Callable[[Any], RenderableType]], None]:
    """A function of (data, how to draw it): json/yaml print the data as it came, table
    and wide draw it from ``visible_data(data)``."""
    def show(data: Any, render: Callable[[Any], RenderableType]) -> None:
        if fmt in (Format.json, Format.yaml):
            console.print(dump(data, fmt), markup=False, highlight=False, soft_wrap=True)
        else:
            console.print(render(visible_data(data)))
    return show


def size(n: Any) -> str:
    """Bytes as an operator reads them: ``512 MiB``, ``1.5 GiB``."""
    if not isinstance(n, (int, float)) or isinstance(n, bool):
        return "-"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" or v == int(v) else f"{v:.1f} {unit}"
        v /= 1024
    return "-"  # not reached


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def move_progress(m: dict | None) -> str:
    """A live move under way (a VM's ``migration``) in one line: where to, its phase,
    and the source's last sample (``to h2: memory, 64 MiB memory + 0 B disk left at
    100 MiB/s, downtime ~40 ms (sampled 2s ago)``)."""
    if not isinstance(m, dict):
        return "-"
    line = f"to {m.get('target_host') or '?'}: {m.get('phase') or m.get('state') or '?'}"
    p = m.get("progress")
    if not isinstance(p, dict):
        return line + " (no sample yet)"
    line += (f", {size(p.get('memory_remaining_bytes'))} memory + {size(p.get('disk_remaining_bytes'))} disk left"
             f" at {size(p.get('memory_bps'))}/s, downtime ~{cell(p.get('expected_downtime_ms'))} ms")
    a = _num(p.get("age_s"))
    return line + (f" (sampled {a:.0f}s ago)" if a is not None else "")


def move_end(last: dict | None) -> str:
    """How the last live move ended (a VM's ``last_migration``): ``h1 -> h2 done in 7.0 s
    (job 6800 ms, downtime 40 ms)``, or failed with its reason."""
    if not isinstance(last, dict):
        return "-"
    line = f"{last.get('from_host') or '?'} -> {last.get('to_host') or '?'} {last.get('result') or '?'}"
    t = _num(last.get("total_s"))
    line += f" in {t:.1f} s" if t is not None else ""
    line += f" (job {cell(last.get('job_ms'))} ms, downtime {cell(last.get('downtime_ms'))} ms)"
    if last.get("reason"):
        line += f": {last['reason']}"
    return line + (f", {when(_num(last.get('finished')))}" if _num(last.get("finished")) else "")
