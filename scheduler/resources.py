"""The scheduler's resource model (pure data, no IO).

host -> NUMA nodes -> pools: dedicated CPUs (the layout's ``vm_cpus``, grouped into SMT
cores), hugepages per size, VFs per PF (tx-bandwidth budget, min-rate capability),
assignable raw disks (bytes/s + IOPS budgets). ``Usage`` is what live allocations hold;
``Allocation`` is one VM's exact share. IO-service and host CPUs never appear here: the
model is built from ``vm_cpus`` only, so nothing downstream can hand them out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from api.cpus import cores_of
from api.layout import Layout


@dataclass(frozen=True)
class NodeRes:
    node: int
    cores: tuple[tuple[int, ...], ...]  # VM CPUs grouped by SMT core, ascending
    hugepages: tuple[tuple[int, int], ...]  # (size_kb, count), ascending size

    @cached_property
    def cpus(self) -> frozenset[int]:
        return frozenset(c for core in self.cores for c in core)

    @cached_property
    def _pages(self) -> dict[int, int]:
        return dict(self.hugepages)

    def pages(self, size_kb: int) -> int:
        return self._pages.get(size_kb, 0)  # a dict: called in every fit (a scan costs 5 % of the claim thread)


@dataclass(frozen=True)
class PfRes:
    name: str
    node: int | None  # None: no affinity reported, usable from any node
    bandwidth_mbps: int  # tx budget: the sum of min-rate guarantees may not exceed it
    slots: tuple[int, ...]  # VF indices
    min_rate_supported: bool = True


@dataclass(frozen=True)
class DiskRes:
    name: str
    id: str
    node: int | None
    cls: str  # "nvme", "ssd", "hdd", ... (registration or derived from the name)
    size_bytes: int
    bytes_sec: int  # 0 = unlimited
    iops: int  # 0 = unlimited
    atomic_write_bytes: int = 0  # the unit a VM is guaranteed here (layout); 0 = not atomic
    atomic_note: str = ""  # hostd's reason, quoted when a request wants more


@dataclass(frozen=True)
class HostRes:
    name: str
    nodes: tuple[NodeRes, ...]
    pfs: tuple[PfRes, ...] = ()
    disks: tuple[DiskRes, ...] = ()
    rack: str = ""
    labels: tuple[tuple[str, str], ...] = ()

    @cached_property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


# ---------------------------------------------------------------- allocations


@dataclass(frozen=True)
class VfAlloc:
    pf: str
    index: int
    max_tx_rate_mbps: int
    min_tx_rate_mbps: int


@dataclass(frozen=True)
class DiskAlloc:
    name: str
    bytes_sec: int
    iops: int


@dataclass(frozen=True)
class Allocation:
    """Exactly what one VM holds on its host."""

    nodes: tuple[int, ...]  # one entry unless the request allowed spanning
    cpus: tuple[int, ...]  # host CPU of vCPU i
    pages: tuple[tuple[int, int, int], ...]  # (node, size_kb, count)
    vfs: tuple[VfAlloc, ...] = ()
    disks: tuple[DiskAlloc, ...] = ()
    # Spanned: vCPUs per guest NUMA cell, cell i on host node ``nodes[i]`` with the next
    # ``cell_vcpus[i]`` entries of ``cpus`` and the ``pages`` entry of that node. Empty: one node.
    cell_vcpus: tuple[int, ...] = ()

    def cells(self) -> tuple[tuple[int, tuple[int, ...], int], ...]:
        """(host node, host CPUs, pages) per guest NUMA cell, in cell order."""
        return split_cells(self.nodes, self.cpus, self.pages, self.cell_vcpus)

    def to_dict(self) -> dict[str, Any]:
        """``dataclasses.asdict`` by hand (it deep-copies generically: slow on the claim path)."""
        return {"nodes": list(self.nodes), "cpus": list(self.cpus), "pages": [list(p) for p in self.pages],
                "vfs": [{"pf": v.pf, "index": v.index, "max_tx_rate_mbps": v.max_tx_rate_mbps,
                         "min_tx_rate_mbps": v.min_tx_rate_mbps} for v in self.vfs],
                "disks": [{"name": d.name, "bytes_sec": d.bytes_sec, "iops": d.iops} for d in self.disks],
                **({"cell_vcpus": list(self.cell_vcpus)} if self.cell_vcpus else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Allocation":
        return cls(nodes=tuple(d["nodes"]), cpus=tuple(d["cpus"]),
                   pages=tuple(tuple(p) for p in d["pages"]),  # type: ignore[misc]
                   vfs=tuple(VfAlloc(**v) for v in d.get("vfs", ())),
                   disks=tuple(DiskAlloc(**x) for x in d.get("disks", ())),
                   cell_vcpus=tuple(d.get("cell_vcpus", ())))


def split_cells(nodes: Sequence[int], cpus: Sequence[int], pages: Iterable[Sequence[int]],
                cell_vcpus: Sequence[int]) -> tuple[tuple[int, tuple[int, ...], int], ...]:
    """``Allocation.cells`` on its fields (also the stored dict form's, on the create
    path): cell i is on ``nodes[i]`` with the next ``cell_vcpus[i]`` CPUs and that node's
    pages; no ``cell_vcpus``: one cell with everything."""
    per_node = {node: n for node, _, n in pages}
    if not cell_vcpus:
        return ((nodes[0], tuple(cpus), sum(per_node.values())),)
    out, at = [], 0
    for node, k in zip(nodes, cell_vcpus):
        out.append((node, tuple(cpus[at:at + k]), per_node.get(node, 0)))
        at += k
    return tuple(out)


@dataclass(frozen=True)
class Usage:
    """What live allocations on one host hold. Immutable: ``plus``/``minus`` return new."""

    cpus: frozenset[int] = frozenset()
    pages: Mapping[tuple[int, int], int] = field(default_factory=dict)  # (node, size_kb) -> pages
    vfs: frozenset[tuple[str, int]] = frozenset()
    reserved_mbps: Mapping[str, int] = field(default_factory=dict)  # pf -> sum of min rates
    disks: frozenset[str] = frozenset()  # a raw disk belongs to at most one VM

    def vfs_on(self, pf: str) -> int:
        """VFs of ``pf`` in use."""
        return sum(1 for p, _ in self.vfs if p == pf)

    def plus(self, a: Allocation) -> "Usage":
        return self._apply(a, 1)

    def minus(self, a: Allocation) -> "Usage":
        return self._apply(a, -1)

    def _apply(self, a: Allocation, sign: int) -> "Usage":
        pages = dict(self.pages)
        for node, size, n in a.pages:
            pages[(node, size)] = pages.get((node, size), 0) + sign * n
        res = dict(self.reserved_mbps)
        for v in a.vfs:
            res[v.pf] = res.get(v.pf, 0) + sign * v.min_tx_rate_mbps
        vfs = {(v.pf, v.index) for v in a.vfs}
        disks = {d.name for d in a.disks}
        if sign > 0:
            return Usage(self.cpus | set(a.cpus), pages, self.vfs | vfs, res, self.disks | disks)
        return Usage(self.cpus - set(a.cpus), {k: v for k, v in pages.items() if v},
                     self.vfs - vfs, {k: v for k, v in res.items() if v}, self.disks - disks)

    @classmethod
    def of(cls, allocations: Iterable[Allocation]) -> "Usage":
        u = cls()
        for a in allocations:
            u = u.plus(a)
        return u

    def to_dict(self) -> dict[str, Any]:
        return {"cpus": sorted(self.cpus),
                "pages": [[n, s, c] for (n, s), c in sorted(self.pages.items())],
                "vfs": sorted([p, i] for p, i in self.vfs),
                "reserved_mbps": dict(sorted(self.reserved_mbps.items())),
                "disks": sorted(self.disks)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Usage":
        return cls(frozenset(d.get("cpus", ())), {(n, s): c for n, s, c in d.get("pages", ())},
                   frozenset((p, i) for p, i in d.get("vfs", ())), dict(d.get("reserved_mbps", {})),
                   frozenset(d.get("disks", ())))


# ---------------------------------------------------------------- from the layout


def disk_class(name: str) -> str:
    """Default class from the kernel name when registration does not give one."""
    if name.startswith("nvme"):
        return "nvme"
    if name.startswith(("sd", "vd", "xvd")):
        return "disk"
    return "other"


def host_from_layout(name: str, layout: Layout, *, siblings: Mapping[int, Sequence[int]] | None = None,
                     min_rate: Mapping[str, bool] | None = None,
                     disk_classes: Mapping[str, str] | None = None, rack: str = "",
                     labels: Mapping[str, str] | None = None) -> HostRes:
    """The host's pools from its carve layout (api/layout.md). ``siblings`` maps a CPU
    to its SMT siblings (topology ``thread_siblings_list``); missing = one thread per core."""
    siblings = siblings or {}
    min_rate = min_rate or {}
    disk_classes = disk_classes or {}
    nodes = tuple(NodeRes(n.node, cores_of(n.vm_cpus, siblings),
                          tuple(sorted((h.size_kb, h.count) for h in n.hugepages)))
                  for n in sorted(layout.nodes, key=lambda n: n.node))
    pfs = tuple(PfRes(p.name, p.node, p.bandwidth_mbps, tuple(sorted(s.index for s in p.slots)),
                      min_rate.get(p.name, True)) for p in sorted(layout.pfs, key=lambda p: p.name))
    disks = tuple(DiskRes(d.name, d.id or "", d.node, disk_classes.get(d.name) or disk_class(d.name),
                          d.size_bytes, d.bytes_sec, d.iops, d.atomic_write_bytes, d.atomic_note)
                  for d in sorted(layout.disks, key=lambda d: d.name))
    return HostRes(name, nodes, pfs, disks, rack, label_items(labels))


def label_items(labels: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """A host's labels as ``HostRes`` keeps them: (key, value) pairs in key order."""
    return tuple(sorted((labels or {}).items()))


def usage_lost(res: HostRes, u: Usage) -> list[str]:
    """What live allocations ``u`` hold that the pools of ``res`` no longer have: the
    resources a re-registration with ``res`` would take from running VMs."""
    lost: list[str] = []
    cpus = {c for n in res.nodes for c in n.cpus}
    if gone := sorted(u.cpus - cpus):
        lost.append(f"allocated CPUs {gone} are no longer VM CPUs")
    pools = {(n.node, size): count for n in res.nodes for size, count in n.hugepages}
    for (node, size), used in sorted(u.pages.items()):
        if used > pools.get((node, size), 0):
            lost.append(f"node {node} would have {pools.get((node, size), 0)} {size} kB pages, {used} allocated")
    slots = {(p.name, i) for p in res.pfs for i in p.slots}
    if gone_vfs := sorted(u.vfs - slots):
        lost.append(f"allocated VFs {[f'{p}:{i}' for p, i in gone_vfs]} are no longer VF slots")
    budget = {p.name: p.bandwidth_mbps for p in res.pfs}
    for pf, mbps in sorted(u.reserved_mbps.items()):
        if mbps > budget.get(pf, 0):
            lost.append(f"PF {pf} would have {budget.get(pf, 0)} Mbit/s, {mbps} reserved")
    if gone_disks := sorted(u.disks - {d.name for d in res.disks}):
        lost.append(f"allocated disks {gone_disks} are no longer assignable")
    return lost
