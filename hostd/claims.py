"""Pure host-side claim: layout + what is used + a VM request -> exact resources.

The scheduler's fit already chose host and NUMA node; hostd picks the exact CPUs,
pages, VF and disks under its ledger lock, and refuses with the field and the
reason when the request cannot be honoured here. No IO in this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hostd.carve.layout import Layout, NodeLayout
from hostd.jsonmodel import from_jsonable, to_jsonable

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MAC_RE = re.compile(r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")


@dataclass(frozen=True)
class DiskReq:
    disk: str  # kernel name or stable id
    bytes_sec: int = 0  # total_bytes_sec the VM gets (0 = no throttle, takes no budget)
    iops: int = 0


@dataclass(frozen=True)
class VfReq:
    pf: str = ""  # "" = any PF on the VM's node
    mac: str = ""
    vlan: int = 0
    max_tx_rate_mbps: int = 0
    min_tx_rate_mbps: int = 0


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


@dataclass(frozen=True)
class Usage:
    """What running VMs hold (from the ledger)."""

    cpus: frozenset[int] = frozenset()
    pages: dict[tuple[int, int], int] = field(default_factory=dict)  # (node, size_kb) -> pages
    vfs: frozenset[tuple[str, int]] = frozenset()  # (pf, index)
    min_rate_mbps: dict[str, int] = field(default_factory=dict)  # pf -> reserved guarantees
    disks: dict[str, tuple[int, int]] = field(default_factory=dict)  # disk -> (bytes_sec, iops)


@dataclass(frozen=True)
class Refusal:
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


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
class Claim:
    node: int
    vcpu_pins: tuple[int, ...]  # host CPU of vCPU i
    emulator_cpus: tuple[int, ...]
    size_kb: int
    pages: int
    vfs: tuple[ClaimedVf, ...]
    disks: tuple[ClaimedDisk, ...]
    emulator_dedicated: bool = False  # emulator_policy "isolate": its CPU is the VM's own

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


def validate_request(req: VmRequest) -> Refusal | None:
    if not _NAME_RE.match(req.name):
        return Refusal("name", "use 1-64 of letters, digits, '_', '.', '-'")
    if req.vcpus < 1:
        return Refusal("vcpus", "must be at least 1")
    if req.memory_mib < 1:
        return Refusal("memory_mib", "must be at least 1")
    if req.hugepage_size_kb <= 0 or (req.memory_mib * 1024) % req.hugepage_size_kb:
        return Refusal("memory_mib", f"must be a multiple of the {req.hugepage_size_kb} kB page size")
    if req.emulator_policy not in ("host", "share", "isolate"):
        return Refusal("emulator_policy", "must be host, share or isolate")
    for i, v in enumerate(req.vfs):
        if v.mac and not _MAC_RE.match(v.mac):
            return Refusal(f"vfs[{i}].mac", f"{v.mac!r} is not a lower-case MAC address")
        if not 0 <= v.vlan <= 4094:
            return Refusal(f"vfs[{i}].vlan", "must be 0 (untagged) to 4094")
        if v.max_tx_rate_mbps and v.min_tx_rate_mbps > v.max_tx_rate_mbps:
            return Refusal(f"vfs[{i}].min_tx_rate_mbps", "exceeds max_tx_rate_mbps")
    names = [d.disk for d in req.disks]
    if len(set(names)) != len(names):
        return Refusal("disks", "a disk is listed twice")
    return None


def claim(layout: Layout, siblings: dict[int, tuple[int, ...]], used: Usage,
          req: VmRequest) -> Claim | Refusal:
    """Choose resources for ``req``; ``siblings`` maps a CPU to its SMT siblings."""
    bad = validate_request(req)
    if bad:
        return bad
    nodes = [n for n in layout.nodes if req.node is None or n.node == req.node]
    if not nodes:
        return Refusal("node", f"node {req.node} has no VM resources on this host")
    refusal: Refusal | None = None
    for n in nodes:
        got = _claim_on_node(layout, n, siblings, used, req)
        if isinstance(got, Claim):
            return got
        refusal = refusal or got
    assert refusal is not None
    return refusal


def _claim_on_node(layout: Layout, n: NodeLayout, siblings: dict[int, tuple[int, ...]],
                   used: Usage, req: VmRequest) -> Claim | Refusal:
    need = req.vcpus + (1 if req.emulator_policy == "isolate" else 0)
    outside = sorted(set(req.prefer_cpus) - set(n.vm_cpus))
    if outside:
        return Refusal("placement.cpus", f"CPUs {outside} are not VM CPUs of node {n.node} "
                                         f"(vm_cpus: {list(n.vm_cpus)})")
    free = [c for c in n.vm_cpus if c not in used.cpus]
    preferred = [c for c in req.prefer_cpus if c in free][:need]
    rest = pick_cpus([c for c in free if c not in preferred], siblings, need - len(preferred))
    cpus = None if rest is None else preferred + rest
    if cpus is None:
        free = len([c for c in n.vm_cpus if c not in used.cpus])
        return Refusal("vcpus", f"node {n.node} has {free} free VM CPUs, {need} needed")
    pins, emu = _emulator(req, layout, n, cpus)
    pages = (req.memory_mib * 1024) // req.hugepage_size_kb
    pool = next((t for t in n.hugepages if t.size_kb == req.hugepage_size_kb), None)
    if pool is None:
        return Refusal("hugepage_size_kb", f"node {n.node} has no {req.hugepage_size_kb} kB pool")
    free_pages = pool.count - used.pages.get((n.node, pool.size_kb), 0)
    if pages > free_pages:
        return Refusal("memory_mib", f"node {n.node} has {free_pages} free {pool.size_kb} kB pages, "
                                     f"{pages} needed")
    vfs = _claim_vfs(layout, n.node, used, req)
    if isinstance(vfs, Refusal):
        return vfs
    disks = _claim_disks(layout, used, req)
    if isinstance(disks, Refusal):
        return disks
    return Claim(n.node, pins, emu, pool.size_kb, pages, vfs, disks,
                 emulator_dedicated=req.emulator_policy == "isolate")


def pick_cpus(free: list[int], siblings: dict[int, tuple[int, ...]], count: int) -> list[int] | None:
    """Whole free cores first (lowest id), then the remaining single threads, so a
    VM does not share a core with another VM when it can be avoided."""
    if count > len(free):
        return None
    if count == 0:
        return []
    free_set = set(free)
    whole, partial = [], []
    seen: set[int] = set()
    for c in sorted(free):
        if c in seen:
            continue
        core = sorted(set(siblings.get(c, (c,))) | {c})
        seen.update(core)
        (whole if all(s in free_set for s in core) else partial).append(
            [s for s in core if s in free_set])
    out: list[int] = []
    for group in whole + partial:
        out.extend(group)
        if len(out) >= count:
            return out[:count]
    return None


def _emulator(req: VmRequest, layout: Layout, n: NodeLayout,
              cpus: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if req.emulator_policy == "isolate":
        return tuple(cpus[:-1]), (cpus[-1],)
    if req.emulator_policy == "host":
        host = n.host_cpus or layout.host_cpus
        if host:
            return tuple(cpus), tuple(host)
    return tuple(cpus), tuple(sorted(cpus))  # "share", or no host CPUs at all


def _claim_vfs(layout: Layout, node: int, used: Usage, req: VmRequest) -> tuple[ClaimedVf, ...] | Refusal:
    taken = set(used.vfs)
    reserved = dict(used.min_rate_mbps)
    out: list[ClaimedVf] = []
    for i, v in enumerate(req.vfs):
        pfs = [p for p in layout.pfs if (p.name == v.pf if v.pf else p.node in (node, None))]
        if not pfs:
            return Refusal(f"vfs[{i}].pf", f"no PF {v.pf!r}" if v.pf else f"no PF on node {node}")
        chosen = None
        for pf in pfs:
            if v.max_tx_rate_mbps > pf.bandwidth_mbps:
                return Refusal(f"vfs[{i}].max_tx_rate_mbps",
                               f"above {pf.name}'s {pf.bandwidth_mbps} Mbit/s")
            if reserved.get(pf.name, 0) + v.min_tx_rate_mbps > pf.bandwidth_mbps:
                continue
            slot = next((s for s in pf.slots if (pf.name, s.index) not in taken), None)
            if slot:
                chosen = (pf, slot)
                break
        if chosen is None:
            return Refusal(f"vfs[{i}]", "no free VF with enough unreserved bandwidth")
        pf, slot = chosen
        taken.add((pf.name, slot.index))
        reserved[pf.name] = reserved.get(pf.name, 0) + v.min_tx_rate_mbps
        out.append(ClaimedVf(pf.name, slot.index, v.max_tx_rate_mbps or slot.max_tx_rate_mbps,
                             v.min_tx_rate_mbps, v.mac, v.vlan))
    return tuple(out)


def _claim_disks(layout: Layout, used: Usage, req: VmRequest) -> tuple[ClaimedDisk, ...] | Refusal:
    out: list[ClaimedDisk] = []
    for i, d in enumerate(req.disks):
        budget = next((b for b in layout.disks if d.disk in (b.name, b.id)), None)
        if budget is None:
            return Refusal(f"disks[{i}].disk", f"{d.disk!r} is not an assignable disk on this host")
        if budget.name in used.disks:
            return Refusal(f"disks[{i}].disk", f"{budget.name} already belongs to another VM")
        if budget.bytes_sec and d.bytes_sec > budget.bytes_sec:
            return Refusal(f"disks[{i}].bytes_sec", f"above {budget.name}'s budget {budget.bytes_sec}")
        if budget.iops and d.iops > budget.iops:
            return Refusal(f"disks[{i}].iops", f"above {budget.name}'s budget {budget.iops}")
        if budget.bytes_sec and not d.bytes_sec:
            return Refusal(f"disks[{i}].bytes_sec", f"{budget.name} has an IO budget: set a limit")
        out.append(ClaimedDisk(budget.name, d.bytes_sec, d.iops))
    return tuple(out)
