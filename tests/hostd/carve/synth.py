"""Synthetic topologies for the planner's tests, shaped like real kernels number them.

Intel numbers the second SMT thread of every core after all first threads
(cpu N and N + ncores are siblings); AMD EPYC does the same per package, while
some BIOSes number siblings adjacently (cpu 2k and 2k + 1). Both styles appear.
"""

from __future__ import annotations

from hostd.discover.model import (
    Cpu,
    Disk,
    HostInfo,
    HugepagePool,
    KvmInfo,
    Nic,
    NumaNode,
    Topology,
    Vf,
)

GIB_KB = 1024 * 1024


def host_info(sizes=(2048, GIB_KB), isolated=()) -> HostInfo:
    return HostInfo(
        hostname="synth", kernel="6.1.0", arch="x86_64", cpu_vendor="GenuineIntel",
        cpu_model="synthetic", hugepage_sizes_kb=tuple(sizes), pdpe1gb=GIB_KB in sizes,
        hugetlbfs_mounts=(), isolated_cpus=tuple(isolated), nohz_full_cpus=(), cgroup_version=2,
        kvm=KvmInfo(True, True, 12, True, "synthetic"), virt_type="kvm", warnings=())


def topology(sockets: int = 1, cores: int = 4, threads: int = 1, nodes_per_socket: int = 1,
             adjacent: bool = False, mem_gib_per_node: int = 64, offline: tuple[int, ...] = (),
             nics: tuple[Nic, ...] = (), disks: tuple[Disk, ...] = (),
             sizes=(2048, GIB_KB), isolated=()) -> Topology:
    """``cores`` per socket, split evenly over ``nodes_per_socket`` nodes."""
    total_cores = sockets * cores
    ncpu = total_cores * threads
    cores_per_node = cores // nodes_per_socket
    cpus = []
    for cpu in range(ncpu):
        if adjacent:
            gcore, thread = divmod(cpu, threads)
        else:
            thread, gcore = divmod(cpu, total_cores)
        sibs = tuple(sorted((gcore * threads + t) if adjacent else (t * total_cores + gcore)
                            for t in range(threads)))
        socket = gcore // cores
        node = gcore // cores_per_node
        cpus.append(Cpu(cpu, gcore % cores, socket, node, sibs, cpu not in offline, cpu in isolated, False))
    node_ids = sorted({c.node for c in cpus})
    mem = mem_gib_per_node * GIB_KB
    nodes = tuple(NumaNode(n, tuple(c.id for c in cpus if c.node == n), mem, mem - GIB_KB,
                           tuple(HugepagePool(s, 0, 0, 0) for s in sizes))
                  for n in node_ids)
    return Topology(host_info(sizes, isolated), tuple(cpus), nodes, nics, disks)


def nic(name: str, node: int | None = 0, total: int = 64, numvfs: int = 0, speed: int | None = 25000) -> Nic:
    vfs = tuple(Vf(i, f"0000:3b:{2 + i // 8:02x}.{i % 8}", "iavf", None, None) for i in range(numvfs))
    return Nic(name, "0000:3b:00.0", "ice", node, speed, "b4:96:91:00:00:01", total, numvfs, vfs)


def disk(name: str, node: int | None = 0, reasons: tuple[str, ...] = (), id: str | None = None,
         size: int = 3_840_000_000_000) -> Disk:
    return Disk(name, id or f"synth-{name}", None, f"S{name}", "SYNTH", size, False, False,
                False, node, (), (), (), False, not reasons, reasons)
