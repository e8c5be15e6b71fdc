"""The carve plan: what the policy makes of a topology (pure data).

The contract between hostd (which plans and applies it) and the scheduler (which
places VMs on it): ``hostd.carve.plan.plan_host(topology, policy)`` makes one, its JSON
form (``Layout.to_json()``) is what `hostd plan --json` prints, `hostd carve` applies
and hostd registers with the scheduler; documented in ``api/layout.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from api.bounds import check_atomic_write_bytes
from api.jsonmodel import from_jsonable, to_jsonable


@dataclass(frozen=True)
class HugepageTarget:
    size_kb: int
    count: int  # pages the pool must hold on this node for VMs

    @property
    def memory_kb(self) -> int:
        return self.size_kb * self.count


@dataclass(frozen=True)
class NodeLayout:
    node: int
    io_cpus: tuple[int, ...]
    host_cpus: tuple[int, ...]
    vm_cpus: tuple[int, ...]
    hugepages: tuple[HugepageTarget, ...]  # one per size the policy asks for on this node


@dataclass(frozen=True)
class VfSlot:
    index: int  # VF index on the PF (virtfnN)
    max_tx_rate_mbps: int  # default cap applied at carve time (0 = none)
    min_tx_rate_mbps: int


@dataclass(frozen=True)
class PfLayout:
    name: str
    pci: str
    node: int | None
    numvfs: int  # sriov_numvfs to set
    bandwidth_mbps: int  # tx budget VMs may reserve across all VFs
    slots: tuple[VfSlot, ...]


@dataclass(frozen=True)
class DiskBudget:
    name: str
    id: str | None
    node: int | None
    size_bytes: int
    bytes_sec: int  # IO budget VMs may consume in total, 0 = unlimited
    iops: int
    # Atomic writes (issue #41; hostd/carve/atomic.py decides): the device's power-fail
    # unit as discovered, and the unit a VM on this disk is guaranteed through a path
    # that carries it to the guest (0: never offered as atomic), with the reason.
    atomic_unit_bytes: int = 0
    atomic_write_bytes: int = 0
    atomic_note: str = ""


@dataclass(frozen=True)
class BootChange:
    """A change that only takes effect after a reboot (kernel cmdline)."""

    param: str  # "isolcpus", "nohz_full", "hugepagesz=1G hugepages"
    value: str
    why: str


@dataclass(frozen=True)
class IoServiceTarget:
    kind: str  # "unit" | "cgroup" | "process" | "none"
    name: str  # unit name, cgroup path, or process match


@dataclass(frozen=True)
class Layout:
    nodes: tuple[NodeLayout, ...]
    pfs: tuple[PfLayout, ...]
    disks: tuple[DiskBudget, ...]
    io_service: IoServiceTarget
    vm_cgroup: str
    reboot_required: tuple[BootChange, ...]
    warnings: tuple[str, ...] = ()

    @property
    def io_cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for n in self.nodes for c in n.io_cpus))

    @property
    def host_cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for n in self.nodes for c in n.host_cpus))

    @property
    def vm_cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for n in self.nodes for c in n.vm_cpus))

    def to_dict(self) -> dict[str, Any]:
        d = to_jsonable(self)
        # Flat views for readers who do not care about nodes.
        d["io_cpus"] = list(self.io_cpus)
        d["host_cpus"] = list(self.host_cpus)
        d["vm_cpus"] = {str(n.node): list(n.vm_cpus) for n in self.nodes}
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Layout":
        core = {k: v for k, v in data.items() if k not in ("io_cpus", "host_cpus", "vm_cpus")}
        return from_jsonable(cls, core, "layout")

    @classmethod
    def from_json(cls, text: str) -> "Layout":
        return cls.from_dict(json.loads(text))


MAX_CPU = 65535  # CPU ids above this are not a real host's
MAX_PAGES_KB = 1 << 40  # one node's pool: 1 PiB of pages is not a real host's either
MAX_MBPS = 10_000_000  # 10 Tbit/s


def layout_problems(layout: Layout) -> list[tuple[str, str]]:
    """(field, reason) for every way ``layout`` cannot describe a real host, checked as
    a whole: ids and counts in range, CPU sets disjoint across roles and nodes (above
    all: no VM CPU is an IO-service CPU), VF slots inside their PF, PF budgets
    positive, names unique. Empty when the layout is sound. hostd's planner only
    makes sound layouts; the scheduler checks every layout a host registers."""
    out: list[tuple[str, str]] = []
    owner: dict[int, str] = {}  # CPU -> the field that has it
    nodes: set[int] = set()
    for i, n in enumerate(layout.nodes):
        _node_problems(f"layout.nodes[{i}]", n, nodes, owner, out)
    _unique("layout.pfs", [p.name for p in layout.pfs], "PF", out)
    for i, p in enumerate(layout.pfs):
        _pf_problems(f"layout.pfs[{i}]", p, out)
    _unique("layout.disks", [d.name for d in layout.disks], "disk", out)
    for i, d in enumerate(layout.disks):
        out += [(f"layout.disks[{i}].{k}", "must not be negative")
                for k in ("size_bytes", "bytes_sec", "iops", "atomic_unit_bytes") if getattr(d, k) < 0]
        try:
            check_atomic_write_bytes(d.atomic_write_bytes)
            if d.atomic_write_bytes > d.atomic_unit_bytes:
                raise ValueError(f"{d.atomic_write_bytes} offered above the device's unit {d.atomic_unit_bytes}")
        except ValueError as e:
            out.append((f"layout.disks[{i}].atomic_write_bytes", str(e)))
    return out


def _unique(at: str, names: list[str], what: str, out: list[tuple[str, str]]) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            out.append((f"{at}[{i}].name", f"{what} {name} is listed twice"))
        seen.add(name)


def _node_problems(at: str, n: NodeLayout, nodes: set[int], owner: dict[int, str],
                   out: list[tuple[str, str]]) -> None:
    if n.node < 0 or n.node > MAX_CPU:
        out.append((f"{at}.node", f"{n.node} is not a NUMA node id"))
    if n.node in nodes:
        out.append((f"{at}.node", f"node {n.node} is listed twice"))
    nodes.add(n.node)
    for role in ("io_cpus", "host_cpus", "vm_cpus"):
        for c in getattr(n, role):
            where = f"{at}.{role}"
            if not 0 <= c <= MAX_CPU:
                out.append((where, f"CPU {c} is not a CPU id (0-{MAX_CPU})"))
            elif c in owner:
                out.append((where, f"CPU {c} is also in {owner[c]}"))
            else:
                owner[c] = where
    sizes: set[int] = set()
    for j, h in enumerate(n.hugepages):
        where = f"{at}.hugepages[{j}]"
        if h.size_kb < 4 or h.size_kb & (h.size_kb - 1):
            out.append((f"{where}.size_kb", f"{h.size_kb} kB is not a page size"))
        elif h.size_kb in sizes:
            out.append((f"{where}.size_kb", f"{h.size_kb} kB is listed twice on node {n.node}"))
        sizes.add(h.size_kb)
        if h.count < 0 or h.size_kb > 0 and h.count * h.size_kb > MAX_PAGES_KB:
            out.append((f"{where}.count", f"{h.count} pages of {h.size_kb} kB is not a real pool"))


def _pf_problems(at: str, p: PfLayout, out: list[tuple[str, str]]) -> None:
    if not 0 < p.bandwidth_mbps <= MAX_MBPS:
        out.append((f"{at}.bandwidth_mbps", f"must be 1-{MAX_MBPS} Mbit/s, not {p.bandwidth_mbps}"))
    if not 0 <= p.numvfs <= 4096:
        out.append((f"{at}.numvfs", f"{p.numvfs} is not a VF count (0-4096)"))
    seen: set[int] = set()
    for j, s in enumerate(p.slots):
        where = f"{at}.slots[{j}]"
        if not 0 <= s.index < max(p.numvfs, 0) or s.index in seen:
            out.append((f"{where}.index", f"VF {s.index} is not a free VF index of {p.numvfs}"))
        seen.add(s.index)
        for k in ("max_tx_rate_mbps", "min_tx_rate_mbps"):
            v = getattr(s, k)
            if not 0 <= v <= max(p.bandwidth_mbps, 0):
                out.append((f"{where}.{k}", f"must be 0-{p.bandwidth_mbps} (the PF's budget), not {v}"))
