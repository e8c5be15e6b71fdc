"""Pure: which VMs a new host layout would not hold (a carve refuses to strand them).

Every VM with a claim counts, stopped ones too: StartVM boots a VM on the claim it
holds. No IO: the caller reads the VMs (the daemon's manager, or the ledger for the
command line) and passes them in.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Protocol

from api.layout import Layout
from hostd.carve.vmclaim import Claim
from hostd.cpulist import format_cpu_list


class HeldVm(Protocol):
    """What the check reads of a VM (hostd.apply.ledger.VmRecord has it)."""

    @property
    def vm_id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def claim(self) -> Claim: ...


def vm_conflicts(layout: Layout, records: Iterable[HeldVm]) -> list[str]:
    """The VMs ``layout`` would not hold, each ``name (vm_id, state): why``: vCPUs on CPUs
    that are not its VM CPUs, an emulator on its IO CPUs, hugepages beyond its pools, VF
    slots or disks it has not got, disk IO beyond its budgets."""
    vm, host = set(layout.vm_cpus), set(layout.host_cpus)
    pools = {(n.node, t.size_kb): t.count for n in layout.nodes for t in n.hugepages}
    slots = {(p.name, s.index) for p in layout.pfs for s in p.slots}
    budgets = {d.name: d for d in layout.disks}
    recs = list(records)
    why: dict[str, list[str]] = {r.vm_id: [] for r in recs}
    pages: dict[tuple[int, int], list[tuple[str, int]]] = defaultdict(list)
    disk_use: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for r in recs:
        c, w = r.claim, why[r.vm_id]
        off = sorted(x for x in c.vcpu_pins if x not in vm)
        if off:
            w.append(f"vCPUs on CPUs {format_cpu_list(off)}, not VM CPUs of the new layout")
        emu = sorted(x for x in c.emulator_cpus if x not in vm | host)
        if emu:
            w.append(f"emulator on CPUs {format_cpu_list(emu)}, IO-service CPUs of the new layout")
        for cell in c.numa_cells:
            pages[(cell.node, c.size_kb)].append((r.vm_id, cell.pages))
        w += [f"VF {v.pf}/{v.index} is not a VF slot of the new layout" for v in c.vfs if (v.pf, v.index) not in slots]
        for d in c.disks:
            if d.name not in budgets:
                w.append(f"disk {d.name} is not assignable in the new layout")
            else:
                disk_use[d.name].append((r.vm_id, d.bytes_sec, d.iops))
    for (node, size), users in pages.items():
        total, have = sum(n for _, n in users), pools.get((node, size), 0)
        if total > have:
            for vm_id, _ in users:
                why[vm_id].append(f"node {node} {size} kB hugepages: VMs hold {total}, the new pool has {have}")
    for name, users in disk_use.items():
        b = budgets[name]
        for label, used, cap in (("bytes/s", sum(u[1] for u in users), b.bytes_sec),
                                 ("IOPS", sum(u[2] for u in users), b.iops)):
            if cap and used > cap:
                for vm_id, *_ in users:
                    why[vm_id].append(f"disk {name}: VMs use {used} {label}, the new budget is {cap}")
    return [f"{r.name} ({r.vm_id}, {r.state}): {'; '.join(why[r.vm_id])}" for r in recs if why[r.vm_id]]
