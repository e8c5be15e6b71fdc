"""Kernel CPU-list syntax ("0-3,8,10-11") parsing and formatting."""

from __future__ import annotations

import re
from collections.abc import Iterable

from api.bounds import MAX_CPUS

_ONES = b"\x01" * MAX_CPUS
_DIGITS = re.compile(r"[0-9]{1,12}")  # ASCII only: int() also takes '1_0', '+1' and other scripts' digits


class CpuListError(ValueError):
    """A CPU list string is malformed."""


def parse_cpu_list(text: str) -> frozenset[int]:
    """Parse the kernel's cpulist format ("0-3,8,10-11:2" stride too) into a set.

    An empty string (what /sys prints for an empty mask) is the empty set. A CPU id at
    or past the kernel's NR_CPUS (``api.bounds.MAX_CPUS``) is refused before any range
    is expanded, as the kernel's own parser refuses it, and a range fills a slice of a
    MAX_CPUS-byte mask: a list from outside ("0-4294967296", or 8,000 times "0-8191")
    costs a few kB and milliseconds.
    """
    text = text.strip()
    if not text:
        return frozenset()
    mask = bytearray(MAX_CPUS)  # one byte per possible CPU: a range costs a slice, not a loop
    top = -1
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise CpuListError(f"empty element in CPU list {text[:80]!r}")
        stride = 1
        if ":" in part:
            part, _, stride_s = part.partition(":")
            stride = _int(stride_s, text)
            if stride <= 0:
                raise CpuListError(f"stride must be positive in CPU list {text[:80]!r}")
        if "-" in part:
            lo_s, _, hi_s = part.partition("-")
            lo, hi = _int(lo_s, text), _int(hi_s, text)
            if hi < lo:
                raise CpuListError(f"range {lo}-{hi} is reversed in CPU list {text[:80]!r}")
        else:
            lo = hi = _int(part, text)
        mask[lo:hi + 1:stride] = _ONES[:len(range(lo, hi + 1, stride))]
        top = max(top, hi)
    return frozenset(i for i in range(top + 1) if mask[i])


def _int(s: str, whole: str) -> int:
    s = s.strip()
    if not _DIGITS.fullmatch(s):
        raise CpuListError(f"{s[:40]!r} is not a CPU number in CPU list {whole[:80]!r}")
    v = int(s)
    if v >= MAX_CPUS:
        raise CpuListError(f"CPU {v} is past the kernel's limit of {MAX_CPUS} CPUs "
                           f"(ids 0-{MAX_CPUS - 1}) in CPU list {whole[:80]!r}")
    return v


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Format CPUs as the kernel does: sorted, ranges collapsed ("0-3,8")."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cpus)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(_fmt_run(run))
        run = [c]
    if run:
        out.append(_fmt_run(run))
    return ",".join(out)


def _fmt_run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
