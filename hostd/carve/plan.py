"""Topology + policy -> Layout (or NoFit). Pure: reads nothing, writes nothing.

The rules, in the order they are applied (``api/layout.md`` has the contract):

1. Only online CPUs are carved. A *core* is a set of SMT siblings
   (``thread_siblings_list``); cores are taken lowest CPU id first.
2. Host OS/hostd CPUs are reserved first, then the resident IO service's, per
   NUMA node (``cpus_per_node``) or as an explicit list (``cpus``). With
   ``whole_cores`` (the default) a count is rounded up to whole cores and an
   explicit list is widened to whole cores, each with a warning.
3. VMs get every CPU left. A core whose siblings were split by a reservation
   (``whole_cores = false``) gives its leftover sibling to the host, not to
   VMs, unless ``vm.allow_split_cores``: a vCPU next to an IO thread on one
   core shares its caches and execution units, which is what carving avoids.
4. Hugepage pools per node and size, by count or percent of node memory; the
   pools of a node may not eat into ``io_floor_percent`` of its memory.
5. SR-IOV: each named PF must exist, be SR-IOV capable, have enough VFs and a
   tx budget (``bandwidth_mbps`` or link speed) that covers the VF guarantees.
6. Disks: those discover found usable, filtered by the policy allow-list, each
   with its IO budget and the atomic-write unit a VM is guaranteed on it
   (``hostd/carve/atomic.py``: only through a path that carries it to the guest).
7. What only a reboot can do (``isolcpus``, ``irqaffinity``, boot-time 1 GiB
   pages) is listed separately in ``reboot_required``; nothing here needs it to
   be applied before the live part works.

The first rule that cannot be met returns a ``NoFit`` naming the policy key.
Everything is sorted, so the same inputs always give the same layout.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from api.layout import (
    BootChange,
    DiskBudget,
    HugepageTarget,
    IoServiceTarget,
    Layout,
    NodeLayout,
    PfLayout,
    VfSlot,
)
from hostd.carve.policy import CpuReservation, Policy
from hostd.cpulist import format_cpu_list
from hostd.carve.atomic import offer as atomic_offer
from hostd.discover.model import Disk, Topology
from hostd.errors import NoFit

# Discover's reason when a disk is usable but not allow-listed; the planner
# re-applies the policy's own allow-list, so this reason alone does not disqualify.
NOT_ALLOWED_PREFIX = "not in the allow-list"
GIB_KB = 1024 * 1024


class _NoFit(Exception):
    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.nofit = NoFit(field, reason)


@dataclass(frozen=True)
class _Core:
    node: int
    cpus: tuple[int, ...]  # online siblings, sorted


def plan_host(topo: Topology, policy: Policy) -> Layout | NoFit:
    """The host layout ``policy`` asks for on ``topo``, or why it cannot be had."""
    try:
        return _Planner(topo, policy).plan()
    except _NoFit as e:
        return e.nofit


class _Planner:
    def __init__(self, topo: Topology, policy: Policy):
        self.topo = topo
        self.policy = policy
        self.warnings: list[str] = []
        online = sorted(c.id for c in topo.cpus if c.online)
        if not online:
            raise _NoFit("topology.cpus", "the topology has no online CPU")
        offline = sorted(c.id for c in topo.cpus if not c.online)
        if offline:
            self.warnings.append(f"CPUs {format_cpu_list(offline)} are offline and not carved")
        self.node_of = {c.id: c.node for c in topo.cpus if c.online}
        self.cores = self._cores()
        self.core_of = {cpu: core for core in self.cores for cpu in core.cpus}

    def _cores(self) -> list[_Core]:
        seen: set[int] = set()
        cores: list[_Core] = []
        for c in sorted(self.topo.cpus, key=lambda c: c.id):
            if not c.online or c.id in seen:
                continue
            sib = tuple(sorted({s for s in (c.siblings or (c.id,)) if s in self.node_of} | {c.id}))
            seen.update(sib)
            cores.append(_Core(c.node, sib))
        return cores

    # ------------------------------------------------------------ CPUs

    def _reserve(self, res: CpuReservation, key: str, taken: set[int]) -> set[int]:
        explicit = res.cpu_set()
        if explicit is not None:
            return self._reserve_list(explicit, res.whole_cores, key, taken)
        if res.cpus_per_node:
            return self._reserve_count(res.cpus_per_node, res.whole_cores, key, taken)
        return set()

    def _reserve_list(self, cpus: frozenset[int], whole: bool, key: str, taken: set[int]) -> set[int]:
        field = f"{key}.cpus"
        for cpu in sorted(cpus):
            if cpu not in self.node_of:
                known = {c.id for c in self.topo.cpus}
                why = "is offline" if cpu in known else "does not exist on this host"
                raise _NoFit(field, f"CPU {cpu} {why} (online: {format_cpu_list(sorted(self.node_of))})")
            if cpu in taken:
                raise _NoFit(field, f"CPU {cpu} is already reserved for the host OS (host.cpus)")
        out = set(cpus)
        if whole:
            for cpu in sorted(cpus):
                out.update(self.core_of[cpu].cpus)
            added = sorted(out - cpus)
            if added:
                clash = sorted(set(added) & taken)
                if clash:
                    raise _NoFit(field, f"whole_cores: sibling CPUs {format_cpu_list(clash)} are "
                                        "already reserved for the host OS (host.cpus)")
                self.warnings.append(f"{field}: added SMT siblings {format_cpu_list(added)} "
                                     "to keep whole cores (whole_cores = true)")
        return out

    def _reserve_count(self, count: int, whole: bool, key: str, taken: set[int]) -> set[int]:
        field = f"{key}.cpus_per_node"
        out: set[int] = set()
        for node in sorted({c.node for c in self.cores}):
            free_cores = [c for c in self.cores if c.node == node and not set(c.cpus) & taken]
            got: list[int] = []
            if whole:
                for core in free_cores:
                    if len(got) >= count:
                        break
                    got.extend(core.cpus)
                if len(got) > count:
                    self.warnings.append(f"{field}: node {node} gets {len(got)} CPUs, "
                                         f"{count} rounded up to whole cores")
            else:
                # Fill one sibling per core first, so a small count does not take
                # both threads of a core when other cores are free.
                free = [cpu for c in free_cores for cpu in c.cpus]
                by_rank = sorted(free, key=lambda cpu: (self.core_of[cpu].cpus.index(cpu), cpu))
                got = by_rank[:count]
            if len(got) < count:
                have = sum(len(c.cpus) for c in free_cores)
                raise _NoFit(field, f"node {node} has {have} free online CPUs; asked for {count}")
            out.update(got)
        return out

    def _cpus(self) -> tuple[set[int], set[int], set[int]]:
        host = self._reserve(self.policy.host, "host", set())
        io = self._reserve(self.policy.io_service, "io_service", host)
        reserved = host | io
        vm: set[int] = set()
        for core in self.cores:
            left = set(core.cpus) - reserved
            if not left:
                continue
            if left != set(core.cpus) and not self.policy.vm.allow_split_cores:
                host |= left
                self.warnings.append(
                    f"CPUs {format_cpu_list(sorted(left))} share a core with reserved CPUs "
                    f"{format_cpu_list(sorted(set(core.cpus) - left))}; given to the host, not VMs "
                    "(set vm.allow_split_cores to use them)")
                continue
            vm |= left
        if not vm:
            raise _NoFit("io_service", f"no CPU is left for VMs: {len(io)} reserved for the IO "
                                       f"service and {len(host)} for the host out of "
                                       f"{len(self.node_of)} online")
        return io, host, vm

    # ------------------------------------------------------------ memory

    def _hugepages(self) -> dict[int, list[HugepageTarget]]:
        pols = self.policy.hugepages
        node_ids = sorted(n.id for n in self.topo.nodes)
        out: dict[int, list[HugepageTarget]] = defaultdict(list)
        seen: set[tuple[int, int]] = set()
        for i, p in enumerate(pols.pools):
            field = f"hugepages.pools[{i}]"
            size = p.size_kb
            if size not in self.topo.host.hugepage_sizes_kb:
                offered = ", ".join(_size_label(s) for s in self.topo.host.hugepage_sizes_kb) or "none"
                hint = " (the CPU lacks pdpe1gb)" if size == GIB_KB and not self.topo.host.pdpe1gb else ""
                raise _NoFit(f"{field}.size", f"{p.size} pages are not offered by this kernel{hint}; "
                                              f"offered: {offered}")
            nodes = p.nodes if p.nodes is not None else tuple(node_ids)
            for n in nodes:
                if n not in node_ids:
                    raise _NoFit(f"{field}.nodes", f"node {n} does not exist (nodes: {node_ids})")
                if (n, size) in seen:
                    raise _NoFit(field, f"a second pool of {p.size} pages for node {n}")
                seen.add((n, size))
                mem_kb = self.topo.node(n).memory_total_kb
                count = (p.count_per_node if p.count_per_node is not None
                         else int(mem_kb * p.percent / 100) // size)
                out[n].append(HugepageTarget(size, count))
        for n, targets in out.items():
            node = self.topo.node(n)
            want = sum(t.memory_kb for t in targets)
            cap = int(node.memory_total_kb * (100 - pols.io_floor_percent) / 100)
            if want > cap:
                raise _NoFit("hugepages.pools",
                             f"node {n}: pools take {want // 1024} MiB of {node.memory_total_kb // 1024} "
                             f"MiB, above the {cap // 1024} MiB allowed by "
                             f"io_floor_percent = {pols.io_floor_percent:g}")
            for t in targets:
                have = next((h.total for h in node.hugepages if h.size_kb == t.size_kb), 0)
                grow_kb = (t.count - have) * t.size_kb
                if grow_kb > node.memory_free_kb:
                    self.warnings.append(
                        f"node {n}: growing the {_size_label(t.size_kb)} pool to {t.count} needs "
                        f"{grow_kb // 1024} MiB but {node.memory_free_kb // 1024} MiB is free now; "
                        "carve may fall short")
            targets.sort(key=lambda t: t.size_kb)
        return out

    # ------------------------------------------------------------ SR-IOV

    def _pfs(self) -> list[PfLayout]:
        nics = {n.name: n for n in self.topo.nics}
        out: list[PfLayout] = []
        seen: set[str] = set()
        for i, p in enumerate(self.policy.sriov.pfs):
            field = f"sriov.pfs[{i}]"
            if p.name in seen:
                raise _NoFit(f"{field}.name", f"PF {p.name} is listed twice")
            seen.add(p.name)
            nic = nics.get(p.name)
            if nic is None:
                capable = sorted(n.name for n in self.topo.nics if n.sriov_totalvfs)
                raise _NoFit(f"{field}.name", f"no NIC named {p.name} "
                                              f"(SR-IOV capable: {', '.join(capable) or 'none'})")
            if nic.sriov_totalvfs == 0:
                raise _NoFit(f"{field}.name", f"{p.name} ({nic.pci}) is not SR-IOV capable")
            if p.vfs > nic.sriov_totalvfs:
                raise _NoFit(f"{field}.vfs", f"{p.name} supports {nic.sriov_totalvfs} VFs; asked for {p.vfs}")
            bw = p.bandwidth_mbps or nic.speed_mbps
            if not bw:
                raise _NoFit(f"{field}.bandwidth_mbps",
                             f"{p.name} link speed is unknown (link down?); set bandwidth_mbps")
            if p.max_tx_rate_mbps > bw:
                raise _NoFit(f"{field}.max_tx_rate_mbps",
                             f"{p.max_tx_rate_mbps} Mbit/s is above the PF budget of {bw} Mbit/s")
            if p.min_tx_rate_mbps and p.max_tx_rate_mbps and p.min_tx_rate_mbps > p.max_tx_rate_mbps:
                raise _NoFit(f"{field}.min_tx_rate_mbps", "is above max_tx_rate_mbps")
            if p.min_tx_rate_mbps * p.vfs > bw:
                raise _NoFit(f"{field}.min_tx_rate_mbps",
                             f"{p.vfs} VFs x {p.min_tx_rate_mbps} Mbit/s guaranteed exceeds the "
                             f"PF budget of {bw} Mbit/s")
            slots = tuple(VfSlot(k, p.max_tx_rate_mbps, p.min_tx_rate_mbps) for k in range(p.vfs))
            out.append(PfLayout(p.name, nic.pci, nic.node, p.vfs, bw, slots))
        return sorted(out, key=lambda pf: pf.name)

    # ------------------------------------------------------------ disks

    def _disks(self) -> list[DiskBudget]:
        pol = self.policy.disks
        out: list[DiskBudget] = []
        matched: set[str] = set()
        paths = frozenset({"virtio-blk"} | ({"emulated-nvme"} if pol.atomic.nvme_emulator else set()))
        for d in sorted(self.topo.disks, key=lambda d: d.name):
            pats = [p for p in pol.allow if allow_matches(p, d)]
            if not pats:
                continue
            matched.update(pats)
            blockers = [r for r in d.reasons if not r.startswith(NOT_ALLOWED_PREFIX)]
            if blockers:
                self.warnings.append(f"disks.allow: {d.name} matches {pats[0]!r} but is not "
                                     f"assignable: {'; '.join(blockers)}")
                continue
            if d.handover:
                self.warnings.append(f"disks.allow: {d.name} is in the layout, but a VM would be refused "
                                     f"it now: {'; '.join(d.handover)}")
            b = pol.budget.get(d.name) or (pol.budget.get(d.id) if d.id else None)
            unit, offered, note = atomic_offer(d, paths)
            out.append(DiskBudget(d.name, d.id, d.node, d.size_bytes,
                                  b.bytes_sec if b else pol.default_bytes_sec,
                                  b.iops if b else pol.default_iops, unit, offered, note))
        for p in pol.allow:
            if p not in matched:
                self.warnings.append(f"disks.allow: {p!r} matches no disk on this host")
        names = {x for d in out for x in (d.name, d.id) if x}
        for key in sorted(pol.budget):
            if key not in names:
                raise _NoFit(f"disks.budget.{key}", "no assignable, allow-listed disk has this name or id")
        return out

    # ------------------------------------------------------------ reboot-only changes

    def _boot_changes(self, io: set[int], host: set[int], vm: set[int],
                      pages: dict[int, list[HugepageTarget]]) -> list[BootChange]:
        out: list[BootChange] = []
        isolated = set(self.topo.host.isolated_cpus)
        if not vm <= isolated:
            out.append(BootChange(
                "isolcpus", f"managed_irq,domain,{format_cpu_list(sorted(vm))}",
                "keep the scheduler's load balancing and managed IRQs off the VM CPUs; "
                "cpusets confine tasks but do not stop kernel housekeeping there"))
        if vm and (io | host):
            out.append(BootChange(
                "irqaffinity", format_cpu_list(sorted(io | host)),
                "default device IRQ affinity on host and IO CPUs, so vCPUs are not interrupted"))
        gig = {n: t.count for n, ts in pages.items() for t in ts if t.size_kb == GIB_KB and t.count}
        have = {n.id: next((h.total for h in n.hugepages if h.size_kb == GIB_KB), 0)
                for n in self.topo.nodes}
        if any(have.get(n, 0) < c for n, c in gig.items()):
            out.append(BootChange(
                "hugepagesz=1G hugepages", str(sum(gig.values())),
                "1 GiB pages need contiguous memory: allocating them after boot often falls "
                "short once memory is fragmented. Carve still tries live; the boot parameter "
                "makes it stick (the kernel spreads boot-time pages over nodes evenly)"))
        return out

    # ------------------------------------------------------------ all of it

    def plan(self) -> Layout:
        io, host, vm = self._cpus()
        pages = self._hugepages()
        pfs = self._pfs()
        disks = self._disks()
        nodes = []
        for n in sorted(self.topo.nodes, key=lambda n: n.id):
            on = lambda s: tuple(sorted(c for c in s if self.node_of.get(c) == n.id))  # noqa: E731
            nodes.append(NodeLayout(n.id, on(io), on(host), on(vm), tuple(pages.get(n.id, ()))))
        empty = [n.node for n in nodes if not n.vm_cpus and (n.io_cpus or n.host_cpus)]
        for n in empty:
            self.warnings.append(f"node {n} has no VM CPUs: VMs will not be placed there")
        ios = self.policy.io_service
        kind = next((k for k in ("unit", "cgroup", "process") if getattr(ios, k)), "none")
        target = IoServiceTarget(kind, getattr(ios, kind) if kind != "none" else "")
        if kind == "none" and io:
            self.warnings.append("io_service CPUs are reserved but no unit, cgroup or process is "
                                 "named: carve will not move the IO service")
        return Layout(tuple(nodes), tuple(pfs), tuple(disks), target, self.policy.vm.cgroup,
                      tuple(self._boot_changes(io, host, vm, pages)), tuple(self.warnings))


def allow_matches(pattern: str, disk: Disk) -> bool:
    """An allow-list entry matches a disk's kernel name, /dev path or stable id
    (fnmatch globs, case-sensitive)."""
    names: Iterable[str] = (disk.name, f"/dev/{disk.name}", *((disk.id, f"/dev/disk/by-id/{disk.id}")
                                                              if disk.id else ()))
    return any(fnmatchcase(n, pattern) for n in names)


def _size_label(kb: int) -> str:
    return f"{kb // GIB_KB}G" if kb >= GIB_KB else f"{kb // 1024}M"
