"""What hybctl prints: ``-o table`` (the default), ``wide`` (more columns), ``json`` and
``yaml`` (the API's answer as it came, for scripts and ``jq``)."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import yaml
from rich.console import Console, Group, RenderableType
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


def cell(v: Any) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v) or "-"
    if isinstance(v, dict):
        return ",".join(f"{k}={x}" for k, x in sorted(v.items())) or "-"
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


def printer(console: Console, fmt: Format) -> Callable[[Any, Callable[[], RenderableType]], None]:
    """A function of (data, what to show as a table): json/yaml print the data, table
    and wide the renderable."""
    def show(data: Any, render: Callable[[], RenderableType]) -> None:
        if fmt in (Format.json, Format.yaml):
            console.print(dump(data, fmt), markup=False, highlight=False, soft_wrap=True)
        else:
            console.print(render())
    return show
