"""Renderers: `table`, `json` (stable interface), `csv`."""

from __future__ import annotations

from tools.kvm_utils.aggregate import Summary
from tools.kvm_utils.render import csv as _csv
from tools.kvm_utils.render import json as _json
from tools.kvm_utils.render import table as _table

FORMATS = {"table": _table.render, "json": _json.render, "csv": _csv.render}


def render(summary: Summary, fmt: str) -> str:
    return FORMATS[fmt](summary)
