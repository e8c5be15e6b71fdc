"""Synthetic host shapes (layouts as hostd's carve planner would produce them) for
tests, the bench and demos: a pure function of the shape parameters.

CPU numbering follows Linux on x86: thread 0 of every core first (node by node), then
the SMT siblings, so core k's threads are k and k + cores.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.layout import DiskBudget, HugepageTarget, IoServiceTarget, Layout, NodeLayout, PfLayout, VfSlot


@dataclass(frozen=True)
class Shape:
    name: str
    nodes: int = 2
    cores_per_node: int = 12
    smt: int = 2
    io_cores_per_node: int = 2  # whole cores for the resident IO service
    host_cores: int = 1  # on node 0, for the host OS / hostd
    pages_2m_per_node: int = 16384  # 32 GiB
    pages_1g_per_node: int = 0
    vfs_per_node: int = 8  # one PF per node
    pf_mbps: int = 25000
    disks_per_node: int = 2
    disk_bytes_sec: int = 2 * 10**9
    disk_iops: int = 400_000


SHAPES = (
    Shape("2s-24c-smt-8vf"),
    Shape("2s-48c-smt-16vf", cores_per_node=24, pages_2m_per_node=32768, pages_1g_per_node=64,
          vfs_per_node=16, disks_per_node=6),
    Shape("1s-16c-smt-4vf", nodes=1, cores_per_node=16, pages_2m_per_node=24576, vfs_per_node=4,
          disks_per_node=4),
    Shape("2s-16c-nosmt-0vf", cores_per_node=16, smt=1, pages_2m_per_node=8192, vfs_per_node=0,
          disks_per_node=0),
)


def make_layout(s: Shape) -> tuple[Layout, dict[int, tuple[int, ...]]]:
    """The layout and the SMT sibling map of a host of shape ``s``."""
    cores = s.nodes * s.cores_per_node
    siblings: dict[int, tuple[int, ...]] = {}
    nodes = []
    for n in range(s.nodes):
        io, host, vm = [], [], []
        for k in range(s.cores_per_node):
            core = n * s.cores_per_node + k
            threads = tuple(core + t * cores for t in range(s.smt))
            for t in threads:
                siblings[t] = threads
            if k < s.io_cores_per_node:
                io.extend(threads)
            elif n == 0 and k < s.io_cores_per_node + s.host_cores:
                host.extend(threads)
            else:
                vm.extend(threads)
        pools = [HugepageTarget(2048, s.pages_2m_per_node)]
        if s.pages_1g_per_node:
            pools.append(HugepageTarget(1048576, s.pages_1g_per_node))
        nodes.append(NodeLayout(n, tuple(sorted(io)), tuple(sorted(host)), tuple(sorted(vm)), tuple(pools)))
    pfs = tuple(PfLayout(f"ens{n}f0", f"0000:{0x3b + n:02x}:00.0", n, s.vfs_per_node, s.pf_mbps,
                         tuple(VfSlot(i, 0, 0) for i in range(s.vfs_per_node)))
                for n in range(s.nodes) if s.vfs_per_node)
    disks = tuple(DiskBudget(f"nvme{n * s.disks_per_node + i}n1", f"nvme-eui.{n:02x}{i:02x}", n,
                             2 * 10**12, s.disk_bytes_sec, s.disk_iops)
                  for n in range(s.nodes) for i in range(s.disks_per_node))
    layout = Layout(tuple(nodes), pfs, disks, IoServiceTarget("unit", "oss.service"), "machine", ())
    return layout, siblings
