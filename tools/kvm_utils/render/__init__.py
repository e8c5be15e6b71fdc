"""Renderers: `table`, `json` (stable interface), `csv`; one module per output format, for
every document (the Summary of report/latency/msr/io and the kprobe views')."""

from __future__ import annotations

from tools.kvm_utils.aggregate import Summary
from tools.kvm_utils.render import csv as _csv
from tools.kvm_utils.render import json as _json
from tools.kvm_utils.render import table as _table

FORMATS = {"table": _table.render, "json": _json.render, "csv": _csv.render}

VIEW_FORMATS = {"table": _table.render_view, "json": _json.render_view}


def render(summary: Summary, fmt: str) -> str:
    return FORMATS[fmt](summary)


def render_view(doc: dict, fmt: str) -> str:
    """A kprobe view's document (kprobe.view_summary) as `table` or `json`."""
    return VIEW_FORMATS[fmt](doc)
