"""Pure host-side claim: layout + what is used + a VM request -> exact resources.

The scheduler's fit already chose host and NUMA node (or, for a VM spanning nodes,
one guest NUMA cell per host node with its vCPU count and memory); hostd picks the
exact CPUs, pages, VF and disks under its ledger lock, and refuses with the field
and the reason when the request cannot be honoured here. No IO in this module.
CPUs the scheduler did not choose are picked by the scheduler's own rule (api/cpus.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from api.cpus import cores_of, pick_cpus
from api.jsonmodel import from_jsonable, to_jsonable
from api.layout import Layout, NodeLayout
from api.states import VfMigration
from hostd.errors import NoFit

_MAC_RE = re.compile(r"([0-9a-f]{2}:){5}[0-9a-f]{2}")


@dataclass(frozen=True)
class DiskReq:
    disk: str  # kernel name or stable id
    bytes_sec: int = 0  # total_bytes_sec the VM gets (0 = no throttle, takes no budget)
    iops: int = 0
    atomic_write_bytes: int = 0  # the atomic unit the guest needs (0 = none)


@dataclass(frozen=True)
class VfReq:
    pf: str = ""  # "" = any PF on the VM's node
    mac: str = ""
    vlan: int = 0
    max_tx_rate_mbps: int = 0
    min_tx_rate_mbps: int = 0
    migration: str = VfMigration.NONE  # how the VF takes a live move


@dataclass(frozen=True)
class CellReq:
    """One guest NUMA cell of a VM spanning host nodes (the scheduler's Placement.cells)."""

    node: int
    vcpus: int
    memory_mib: int
    prefer_cpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class VmRequest:
    request_id: str
    name: str
    vcpus: int
    memory_mib: int
    hugepage_size_kb: int = 2048
    node: int | None = None  # None: first node that fits
    disks: tuple[DiskReq, ...] = ()
    vfs: tuple[VfReq, ...] = ()
    emulator_policy: str = "host"  # "host" | "share" | "isolate"
    prefer_cpus: tuple[int, ...] = ()  # the scheduler's pick; taken where still free
    cells: tuple[CellReq, ...] = ()  # spanning: one per guest cell (``node``/``prefer_cpus`` unused)


@dataclass(frozen=True)
class Usage:
    """What running VMs hold (from the ledger)."""

    cpus: frozenset[int] = frozenset()
    pages: dict[tuple[int, int], int] = field(default_factory=dict)  # (node, size_kb) -> pages
    vfs: frozenset[tuple[str, int]] = frozenset()  # (pf, index)
    min_rate_mbps: dict[str, int] = field(default_factory=dict)  # pf -> reserved guarantees
    disks: dict[str, tuple[int, int]] = field(default_factory=dict)  # disk -> (bytes_sec, iops)


@dataclass(frozen=True)
class ClaimedVf:
    pf: str
    index: int
    max_tx_rate_mbps: int
    min_tx_rate_mbps: int
    mac: str
    vlan: int


@dataclass(frozen=True)
class ClaimedDisk:
    name: str
    bytes_sec: int
    iops: int


@dataclass(frozen=True)
class ClaimCell:
    node: int
    vcpus: int  # the next ``vcpus`` entries of ``Claim.vcpu_pins``
    pages: int


@dataclass(frozen=True)
class Claim:
    node: int  # the VM's node; the first cell's when it spans
    vcpu_pins: tuple[int, ...]  # host CPU of vCPU i
    emulator_cpus: tuple[int, ...]
    size_kb: int
    pages: int  # all of them
    vfs: tuple[ClaimedVf, ...]
    disks: tuple[ClaimedDisk, ...]
    emulator_dedicated: bool = False  # emulator_policy "isolate": its CPU is the VM's own
    cells: tuple[ClaimCell, ...] = ()  # guest NUMA cells of a VM spanning nodes; () = one node

    @property
    def numa_cells(self) -> tuple[ClaimCell, ...]:
        """Guest cells, a one-node VM's single cell included."""
        return self.cells or (ClaimCell(self.node, len(self.vcpu_pins), self.pages),)

    @property
    def spans(self) -> bool:
        return len(self.cells) > 1

    def cell_pins(self) -> tuple[tuple[int, ...], ...]:
        """Host CPUs of each cell's vCPUs, in cell order."""
        out, at = [], 0
        for c in self.numa_cells:
            out.append(self.vcpu_pins[at:at + c.vcpus])
            at += c.vcpus
        return tuple(out)

    @property
    def dedicated_cpus(self) -> tuple[int, ...]:
        """CPUs no other VM may use while this one exists."""
        extra = self.emulator_cpus if self.emulator_dedicated else ()
        return tuple(sorted(set(self.vcpu_pins) | set(extra)))

    def to_dict(self) -> dict:
        return to_jsonable(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Claim":
        return from_jsonable(cls, d, "claim")


def validate_request(req: VmRequest) -> NoFit | None:
    """What the claim needs of a request to be one VM. The fields' bounds (names,
    lengths, ids) are checked before, once: ``vmspec.spec_problem``."""
    if req.hugepage_size_kb <= 0 or (req.memory_mib * 1024) % req.hugepage_size_kb:
        return NoFit("memory_mib", f"must be a multiple of the {req.hugepage_size_kb} kB page size")
    if req.emulator_policy not in ("host", "share", "isolate"):
        return NoFit("emulator_policy", "must be host, share or isolate")
    for i, v in enumerate(req.vfs):
        if v.mac and not _MAC_RE.fullmatch(v.mac):
            return NoFit(f"vfs[{i}].mac", f"{v.mac!r} is not a lower-case MAC address")
        if not 0 <= v.vlan <= 4094:
            return NoFit(f"vfs[{i}].vlan", "must be 0 (untagged) to 4094")
        if v.max_tx_rate_mbps and v.min_tx_rate_mbps > v.max_tx_rate_mbps:
            return NoFit(f"vfs[{i}].min_tx_rate_mbps", "exceeds max_tx_rate_mbps")
    return _validate_cells(req)


def _validate_cells(req: VmRequest) -> NoFit | None:
    if not req.cells:
        return None
    if len(req.cells) < 2:
        return NoFit("placement.cells", "give two or more cells, or none (one node: placement.numa_node)")
    for i, c in enumerate(req.cells):
        if c.vcpus < 1:
            return NoFit(f"placement.cells[{i}].cpus", "every guest NUMA cell needs a vCPU")
        if c.memory_mib < 1 or (c.memory_mib * 1024) % req.hugepage_size_kb:
            return NoFit(f"placement.cells[{i}].memory_mib",
                           f"must be a positive multiple of the {req.hugepage_size_kb} kB page size")
    nodes = [c.node for c in req.cells]
    if len(set(nodes)) != len(nodes):
        return NoFit("placement.cells", f"a host node is given twice ({nodes})")
    if sum(c.vcpus for c in req.cells) != req.vcpus:
        return NoFit("placement.cells", f"the cells hold {sum(c.vcpus for c in req.cells)} vCPUs, "
                                          f"the VM has {req.vcpus}")
    if sum(c.memory_mib for c in req.cells) != req.memory_mib:
        return NoFit("placement.cells", f"the cells hold {sum(c.memory_mib for c in req.cells)} MiB, "
                                          f"the VM has {req.memory_mib}")
    return None


def claim(layout: Layout, siblings: dict[int, tuple[int, ...]], used: Usage,
          req: VmRequest) -> Claim | NoFit:
    """Choose resources for ``req``; ``siblings`` maps a CPU to its SMT siblings."""
    bad = validate_request(req)
    if bad:
        return bad
    by_node = {n.node: n for n in layout.nodes}
    if req.cells:
        missing = [c.node for c in req.cells if c.node not in by_node]
        if missing:
            return NoFit("placement.cells", f"nodes {missing} have no VM resources on this host")
        return _claim_cells(layout, [(by_node[c.node], c) for c in req.cells], siblings, used, req)
    nodes = [n for n in layout.nodes if req.node is None or n.node == req.node]
    if not nodes:
        return NoFit("node", f"node {req.node} has no VM resources on this host")
    refusal: NoFit | None = None
    for n in nodes:
        whole = CellReq(n.node, req.vcpus, req.memory_mib, req.prefer_cpus)
        got = _claim_cells(layout, [(n, whole)], siblings, used, req)
        if isinstance(got, Claim):
            return got
        refusal = refusal or got
    assert refusal is not None
    return refusal


def _claim_cells(layout: Layout, cells: list[tuple[NodeLayout, CellReq]],
                 siblings: dict[int, tuple[int, ...]], used: Usage, req: VmRequest) -> Claim | NoFit:
    """Every cell on its own node: its vCPUs' CPUs and its pages from that node only.
    The emulator CPU of ``isolate`` comes from the first cell's node."""
    field = "placement.cpus" if len(cells) == 1 else "placement.cells[{i}].cpus"
    pins: list[int] = []
    extra: list[int] = []
    claimed: list[ClaimCell] = []
    for i, (n, c) in enumerate(cells):
        need = c.vcpus + (1 if i == 0 and req.emulator_policy == "isolate" else 0)
        outside = sorted(set(c.prefer_cpus) - set(n.vm_cpus))
        if outside:
            return NoFit(field.format(i=i), f"CPUs {outside} are not VM CPUs of node {n.node} "
                                              f"(vm_cpus: {list(n.vm_cpus)})")
        free = [x for x in n.vm_cpus if x not in used.cpus]
        preferred = [x for x in c.prefer_cpus if x in free][:need]
        rest = pick_cpus(cores_of(n.vm_cpus, siblings), used.cpus | set(preferred), need - len(preferred))
        if len(preferred) + len(rest) < need:
            return NoFit("vcpus", f"node {n.node} has {len(free)} free VM CPUs, {need} needed")
        cpus = preferred + rest
        if need > c.vcpus:  # isolate: the last one runs the emulator
            extra = cpus[-1:]
            cpus = cpus[:-1]
        pins += cpus
        pool = next((t for t in n.hugepages if t.size_kb == req.hugepage_size_kb), None)
        if pool is None:
            return NoFit("hugepage_size_kb", f"node {n.node} has no {req.hugepage_size_kb} kB pool")
        pages = (c.memory_mib * 1024) // req.hugepage_size_kb
        free_pages = pool.count - used.pages.get((n.node, pool.size_kb), 0)
        if pages > free_pages:
            return NoFit("memory_mib", f"node {n.node} has {free_pages} free {pool.size_kb} kB pages, "
                                         f"{pages} needed")
        claimed.append(ClaimCell(n.node, c.vcpus, pages))
    vfs = _claim_vfs(layout, {n.node for n, _ in cells}, used, req)
    if isinstance(vfs, NoFit):
        return vfs
    disks = _claim_disks(layout, used, req)
    if isinstance(disks, NoFit):
        return disks
    emu = _emulator(req, layout, [n for n, _ in cells], pins, extra)
    return Claim(cells[0][0].node, tuple(pins), emu, req.hugepage_size_kb, sum(c.pages for c in claimed),
                 vfs, disks, emulator_dedicated=req.emulator_policy == "isolate",
                 cells=tuple(claimed) if len(claimed) > 1 else ())


def _emulator(req: VmRequest, layout: Layout, nodes: list[NodeLayout], pins: list[int],
              extra: list[int]) -> tuple[int, ...]:
    """Where QEMU's emulator and IO threads run: the VM's own extra CPU (isolate), the
    host CPUs of its nodes (host; the layout's shared host CPUs when its nodes have
    none), else its vCPUs' CPUs (share, or no host CPUs at all)."""
    if req.emulator_policy == "isolate":
        return tuple(extra)
    if req.emulator_policy == "host":
        host = sorted({c for n in nodes for c in n.host_cpus}) or list(layout.host_cpus)
        if host:
            return tuple(host)
    return tuple(sorted(pins))


def _claim_vfs(layout: Layout, nodes: set[int], used: Usage, req: VmRequest) -> tuple[ClaimedVf, ...] | NoFit:
    taken = set(used.vfs)
    reserved = dict(used.min_rate_mbps)
    out: list[ClaimedVf] = []
    for i, v in enumerate(req.vfs):
        pfs = [p for p in layout.pfs if (p.name == v.pf if v.pf else p.node is None or p.node in nodes)]
        if not pfs:
            where = ", ".join(map(str, sorted(nodes)))
            return NoFit(f"vfs[{i}].pf", f"no PF {v.pf!r}" if v.pf else f"no PF on node {where}")
        chosen = None
        for pf in pfs:
            if v.max_tx_rate_mbps > pf.bandwidth_mbps:
                return NoFit(f"vfs[{i}].max_tx_rate_mbps",
                               f"above {pf.name}'s {pf.bandwidth_mbps} Mbit/s")
            if reserved.get(pf.name, 0) + v.min_tx_rate_mbps > pf.bandwidth_mbps:
                continue
            slot = next((s for s in pf.slots if (pf.name, s.index) not in taken), None)
            if slot:
                chosen = (pf, slot)
                break
        if chosen is None:
            return NoFit(f"vfs[{i}]", "no free VF with enough unreserved bandwidth")
        pf, slot = chosen
        taken.add((pf.name, slot.index))
        reserved[pf.name] = reserved.get(pf.name, 0) + v.min_tx_rate_mbps
        out.append(ClaimedVf(pf.name, slot.index, v.max_tx_rate_mbps or slot.max_tx_rate_mbps,
                             v.min_tx_rate_mbps, v.mac, v.vlan))
    return tuple(out)


def _claim_disks(layout: Layout, used: Usage, req: VmRequest) -> tuple[ClaimedDisk, ...] | NoFit:
    out: list[ClaimedDisk] = []
    for i, d in enumerate(req.disks):
        budget = next((b for b in layout.disks if d.disk in (b.name, b.id)), None)
        if budget is None:
            return NoFit(f"disks[{i}].disk", f"{d.disk!r} is not an assignable disk on this host")
        twice = next((j for j, x in enumerate(out) if x.name == budget.name), None)
        if twice is not None:  # by name and by id, say: one device, so one claim
            return NoFit(f"disks[{i}].disk", f"{d.disk!r} is {budget.name}, as disks[{twice}] is")
        if budget.name in used.disks:
            return NoFit(f"disks[{i}].disk", f"{budget.name} already belongs to another VM")
        if budget.bytes_sec and d.bytes_sec > budget.bytes_sec:
            return NoFit(f"disks[{i}].bytes_sec", f"above {budget.name}'s budget {budget.bytes_sec}")
        if budget.iops and d.iops > budget.iops:
            return NoFit(f"disks[{i}].iops", f"above {budget.name}'s budget {budget.iops}")
        if budget.bytes_sec and not d.bytes_sec:
            return NoFit(f"disks[{i}].bytes_sec", f"{budget.name} has an IO budget: set a limit")
        if d.atomic_write_bytes > budget.atomic_write_bytes:
            why = (f"guarantees {budget.atomic_write_bytes} B" if budget.atomic_write_bytes else
                   f"is not offered as atomic ({budget.atomic_note or 'no atomic-write unit'})")
            return NoFit(f"disks[{i}].atomic_write_bytes",
                         f"{budget.name} {why}, {d.atomic_write_bytes} B wanted")
        out.append(ClaimedDisk(budget.name, d.bytes_sec, d.iops))
    return tuple(out)
