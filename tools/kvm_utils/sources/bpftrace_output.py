"""What bpftrace prints -> maps, hist()/lhist() blocks and printf lines: the one parser of
bpftrace's output, in either of its two modes, for every engine that runs bpftrace.

- `-f json` (latency/msr/io, diagnose, the counting engine of `exits --engine bpf`): one
  record per line, `{"type": "map"|"stats"|"hist"|"printf"|..., "data": ...}`, multi-keys
  joined by ",".
- text (the kprobe engine): what a person running the same one-liner sees, so recordings
  from anywhere are fixtures; `@name[k1, k2]: value` lines, a hist()/lhist() block as
  `@name[k]: ` then `[lo, hi)  count |@@@|` rows to a blank line, `count N, average N,
  total N` for stats(). Programs with hist() run in this mode: bpftrace 0.17's JSON writes a
  bucket's bounds as 32-bit numbers (recorded here: [2G, 4G) came out as min -2147483648,
  max 0), its text is right.

A line is a JSON record when it starts with `{"type"` (every line bpftrace writes in JSON
mode does; our programs printf no such line), any other line is text, so one call reads
either mode's output and both give the same `Output`. Histogram buckets follow
`aggregate.Bucket`'s rule (both bounds inclusive): text `[2, 4)` and JSON
`{"min": 2, "max": 3}` are the same Bucket(2, 3).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from tools.kvm_utils.aggregate import Bucket

Key = tuple[int | str, ...]


@dataclass
class Output:
    maps: dict[str, dict[Key, object]] = field(default_factory=dict)        # int, str or stats dict
    hists: dict[str, dict[Key, list[Bucket]]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)       # printf lines (and anything else)


_JSON_RECORD = re.compile(r'^\{\s*"type"\s*:')
_ATTACHING = re.compile(r"^Attaching \d+ probes?\.\.\.$")     # "1 probe...", "5 probes..."
_MAP = re.compile(r"^@(\w*)(?:\[(.*)\])?:(?: (.*))?$")
_HIST_ROW = re.compile(r"^([\[(])(.+?)([\])])\s+(\d+)\s+\|")
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50, "E": 1 << 60}
_STATS = re.compile(r"^count (-?\d+), average (-?\d+), total (-?\d+)$")
_STATS_KEYS = {"count", "average", "total"}
_INT = re.compile(r"-?\d+")


def parse(text: str) -> Output:
    """bpftrace's stdout, text or `-f json` (or one line of it) -> Output. Integer keys are
    ints, other keys strings; a scalar map has the key ()."""
    out = Output()
    hist: list[Bucket] | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if _JSON_RECORD.match(line):
            hist = None
            _json_record(out, line)
            continue
        if hist is not None:
            m = _HIST_ROW.match(line)
            if m:
                hist.append(_text_bucket(m.group(1), m.group(2), m.group(3), int(m.group(4))))
                continue
            hist = None
        if not line or _ATTACHING.match(line):
            continue
        m = _MAP.match(line)
        if m:
            name, key = m.group(1), _key(m.group(2), ", ")
            if m.group(3) is None:                    # a hist()/lhist() block follows
                hist = out.hists.setdefault(name, {}).setdefault(key, [])
            else:
                out.maps.setdefault(name, {})[key] = _text_value(m.group(3))
            continue
        out.lines.append(line)
    return out


def int_maps(out: Output) -> dict[str, dict[tuple[int, ...], int]]:
    """Integer-keyed integer maps only: the shape the summaries and the counters take."""
    return {name: {k: v for k, v in values.items()
                   if isinstance(v, int) and all(isinstance(x, int) for x in k)}
            for name, values in out.maps.items()}


def _key(text: str | None, sep: str) -> Key:
    """`1, x` (text) or `1,x` (JSON) -> (1, "x")."""
    if text is None:
        return ()
    return tuple(int(p) if _INT.fullmatch(p) else p for p in (x.strip() for x in text.split(sep)))


# ---- text mode ---------------------------------------------------------------------------

def _num(s: str) -> int | None:
    s = s.strip()
    if s == "...":
        return None
    m = re.fullmatch(r"(-?\d+)([KMGTPE]?)", s)
    if not m:
        raise ValueError(f"hist bound {s!r} is not a number with an optional K/M/G/T/P/E suffix")
    return int(m.group(1)) * _SUFFIX[m.group(2)]


def _text_bucket(open_: str, body: str, close: str, n: int) -> Bucket:
    """A printed row's bounds -> Bucket: `[0]` is one value, `[lo, hi)` and lhist's open
    `(..., hi)` / `[lo, ...)` rows are half-open as printed."""
    if open_ == "[" and close == "]":
        v = _num(body)
        return Bucket(v, v, n)
    lo, hi = (_num(p) for p in body.split(",", 1))
    return Bucket(lo, None if hi is None else hi - 1, n)


def _text_value(text: str) -> object:
    if _INT.fullmatch(text):
        return int(text)
    m = _STATS.match(text)
    if m:
        return {"count": int(m.group(1)), "average": int(m.group(2)), "total": int(m.group(3))}
    return text


# ---- -f json mode ------------------------------------------------------------------------

def _json_record(out: Output, line: str) -> None:
    rec = json.loads(line)
    kind, data = rec.get("type"), rec.get("data")
    if kind in ("map", "stats"):
        for name, values in data.items():
            scalar = not isinstance(values, dict) or (kind == "stats" and set(values) == _STATS_KEYS
                                                      and all(isinstance(v, int) for v in values.values()))
            items = {(): values} if scalar else {_key(k, ","): v for k, v in values.items()}
            out.maps.setdefault(name.lstrip("@"), {}).update(items)
    elif kind == "hist":
        for name, values in data.items():
            keyed = values.items() if isinstance(values, dict) else [(None, values)]
            target = out.hists.setdefault(name.lstrip("@"), {})
            for k, rows in keyed:
                target[_key(k, ",")] = [Bucket(r.get("min"), r.get("max"), r["count"]) for r in rows]
    elif kind == "attached_probes":
        pass
    elif isinstance(data, str):                       # printf, time, join, ...
        out.lines.extend(data.splitlines())
    else:
        out.lines.append(line)
