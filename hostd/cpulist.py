"""Kernel CPU-list syntax ("0-3,8,10-11") parsing and formatting."""

from __future__ import annotations

from collections.abc import Iterable


class CpuListError(ValueError):
    """A CPU list string is malformed."""


def parse_cpu_list(text: str) -> frozenset[int]:
    """Parse the kernel's cpulist format ("0-3,8,10-11:2" stride too) into a set.

    An empty string (what /sys prints for an empty mask) is the empty set.
    """
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return frozenset()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise CpuListError(f"empty element in CPU list {text!r}")
        stride = 1
        if ":" in part:
            part, _, stride_s = part.partition(":")
            stride = _int(stride_s, text)
            if stride <= 0:
                raise CpuListError(f"stride must be positive in CPU list {text!r}")
        if "-" in part:
            lo_s, _, hi_s = part.partition("-")
            lo, hi = _int(lo_s, text), _int(hi_s, text)
            if hi < lo:
                raise CpuListError(f"range {lo}-{hi} is reversed in CPU list {text!r}")
            cpus.update(range(lo, hi + 1, stride))
        else:
            cpus.add(_int(part, text))
    return frozenset(cpus)


def _int(s: str, whole: str) -> int:
    try:
        v = int(s.strip(), 10)
    except ValueError:
        raise CpuListError(f"{s!r} is not a CPU number in CPU list {whole!r}") from None
    if v < 0:
        raise CpuListError(f"negative CPU {v} in CPU list {whole!r}")
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
