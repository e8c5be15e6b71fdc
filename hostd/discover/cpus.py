"""CPUs from /sys/devices/system/cpu: topology, online state, isolation."""

from __future__ import annotations

import re

from hostd.discover.fs import HostFs
from hostd.discover.model import Cpu

CPU_DIR = "sys/devices/system/cpu"
_CPU_NAME = re.compile(r"cpu(\d+)$")
_NODE_LINK = re.compile(r"node(\d+)$")


def cpu_ids(fs: HostFs) -> list[int]:
    """Every CPU the kernel knows (present), online or not."""
    ids = [int(m.group(1)) for n in fs.listdir(CPU_DIR) if (m := _CPU_NAME.match(n))]
    if not ids:
        fs.warn(f"{fs.show(CPU_DIR)}: no cpuN directories; no CPUs reported")
    return sorted(ids)


def isolated_cpus(fs: HostFs) -> frozenset[int]:
    """``isolcpus=`` CPUs (/sys/devices/system/cpu/isolated, empty when none)."""
    return fs.cpu_list(f"{CPU_DIR}/isolated", optional=True) or frozenset()


def nohz_full_cpus(fs: HostFs) -> frozenset[int]:
    """``nohz_full=`` CPUs; the file exists only on CONFIG_NO_HZ_FULL kernels."""
    return fs.cpu_list(f"{CPU_DIR}/nohz_full", optional=True) or frozenset()


def online_cpus(fs: HostFs) -> frozenset[int]:
    """The CPUs the kernel runs tasks on, as the host under ``fs`` says: empty when it
    says nothing (no ``online`` file, no cpuN directories), never this machine's CPUs."""
    return frozenset(_online(fs, cpu_ids(fs)))


def _online(fs: HostFs, ids: list[int]) -> set[int]:
    listed = fs.cpu_list(f"{CPU_DIR}/online", optional=True)
    if listed is not None:
        return set(listed)
    # Older layouts: per-CPU "online" files; cpu0 often has none (it cannot go offline).
    return {c for c in ids if fs.int(f"{CPU_DIR}/cpu{c}/online", optional=True) != 0}


def _node_from_link(fs: HostFs, cpu: int) -> int | None:
    for name in fs.listdir(f"{CPU_DIR}/cpu{cpu}"):
        if m := _NODE_LINK.match(name):
            return int(m.group(1))
    return None


def read_cpus(fs: HostFs, node_of: dict[int, int]) -> tuple[Cpu, ...]:
    """One ``Cpu`` per present CPU.

    ``node_of`` comes from the NUMA nodes' cpulists; a CPU absent there (offline
    CPUs are) takes the node from its ``cpuN/nodeM`` link, else node 0. Offline
    CPUs have no topology directory: their core and socket are -1 (unknown) and
    their siblings only themselves.
    """
    ids = cpu_ids(fs)
    online = _online(fs, ids)
    isolated = isolated_cpus(fs)
    nohz = nohz_full_cpus(fs)
    out = []
    for c in ids:
        topo = f"{CPU_DIR}/cpu{c}/topology"
        up = c in online
        core = fs.int(f"{topo}/core_id", optional=not up)
        socket = fs.int(f"{topo}/physical_package_id", optional=not up)
        sibs = fs.cpu_list(f"{topo}/thread_siblings_list", optional=not up)
        node = node_of.get(c)
        if node is None:
            node = _node_from_link(fs, c)
        if node is None:
            node = 0
            if up and node_of:
                fs.warn(f"cpu{c}: in no NUMA node's cpulist; reported on node 0")
        out.append(Cpu(
            id=c,
            core=-1 if core is None else core,
            socket=-1 if socket is None else socket,
            node=node,
            siblings=tuple(sorted(sibs | {c})) if sibs else (c,),
            online=up,
            isolated=c in isolated,
            nohz_full=c in nohz,
        ))
    return tuple(out)
