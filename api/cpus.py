"""Which CPUs of a NUMA node a VM's vCPUs get: one rule for both sides.

The scheduler's fit (``scheduler/fit.py``) picks CPUs to decide where a VM goes and
sends them as ``Placement.cpus``; hostd's claim check (``hostd/carve/vmclaim.py``)
takes those where still free and picks the rest itself, for a VM created without a
placement or when its ledger differs from the scheduler's view. Both call this
module, so a pick made on either side is the pick the other would make.

The rule: whole free SMT cores first (lowest id) while a whole core still fits the
remaining count, so no two VMs share a core when that can be avoided; then the free
threads of cores that are split already; then threads of the remaining whole cores.
Only VM CPUs count: a core whose sibling belongs to the host or the IO service is a
core of its VM threads alone.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence


def cores_of(cpus: Iterable[int], siblings: Mapping[int, Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Group ``cpus`` into SMT cores, ascending (only CPUs from ``cpus`` are kept).
    ``siblings`` maps a CPU to its thread siblings; a CPU missing from it is a core alone."""
    mine = set(cpus)
    out: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for c in sorted(mine):
        if c in seen:
            continue
        core = tuple(sorted((set(siblings.get(c, ())) | {c}) & mine))
        seen.update(core)
        out.append(core)
    return tuple(out)


def pick_cpus(cores: Sequence[Sequence[int]], used: Collection[int], count: int) -> list[int]:
    """Up to ``count`` CPUs of ``cores`` not in ``used`` (fewer when fewer are free)."""
    whole: list[Sequence[int]] = []
    split: list[int] = []
    for core in cores:
        free = [c for c in core if c not in used]
        if len(free) == len(core):
            whole.append(core)
        else:
            split.extend(free)
    out: list[int] = []
    rest: list[Sequence[int]] = []
    for core in whole:
        if len(core) <= count - len(out):
            out.extend(core)
        else:
            rest.append(core)
    if len(out) < count:
        out.extend(split[:count - len(out)])
    for core in rest:
        if len(out) >= count:
            break
        out.extend(core[:count - len(out)])
    return out
