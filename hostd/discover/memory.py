"""NUMA nodes, hugepage pools and hugetlbfs mounts.

Per-node pools come from /sys/devices/system/node/nodeN/hugepages/hugepages-<size>kB
(nr/free/surplus; the kernel keeps no per-node reserved count), the host-wide
pools, with ``resv_hugepages``, from /sys/kernel/mm/hugepages.
"""

from __future__ import annotations

import re

from hostd.discover.fs import HostFs
from hostd.discover.model import HugepagePool, HugetlbfsMount, NumaNode

NODE_DIR = "sys/devices/system/node"
GLOBAL_HP_DIR = "sys/kernel/mm/hugepages"
_NODE_NAME = re.compile(r"node(\d+)$")
_HP_NAME = re.compile(r"hugepages-(\d+)kB$")
_MEMINFO = re.compile(r"^(?:Node \d+ )?(\w+):\s+(\d+)(?: kB)?$")
_SIZE = re.compile(r"^(\d+)([KMGkmg]?)$")


def hugepage_sizes(fs: HostFs) -> tuple[int, ...]:
    """Sizes (kB) the kernel offers: 2048 everywhere on x86, 1048576 with pdpe1gb."""
    sizes = [int(m.group(1)) for n in fs.listdir(GLOBAL_HP_DIR) if (m := _HP_NAME.match(n))]
    if not sizes:
        fs.warn(f"{fs.show(GLOBAL_HP_DIR)}: no hugepage sizes (kernel without HugeTLB?)")
    return tuple(sorted(sizes))


def _pool(fs: HostFs, d: str, size_kb: int, *, with_resv: bool) -> HugepagePool:
    def n(attr: str) -> int:
        v = fs.int(f"{d}/{attr}")
        return 0 if v is None else v

    return HugepagePool(size_kb=size_kb, total=n("nr_hugepages"), free=n("free_hugepages"),
                        surplus=n("surplus_hugepages"),
                        reserved=n("resv_hugepages") if with_resv else None)


def global_pools(fs: HostFs, sizes: tuple[int, ...]) -> tuple[HugepagePool, ...]:
    """Host-wide pools, one per size, with the reserved count."""
    return tuple(_pool(fs, f"{GLOBAL_HP_DIR}/hugepages-{s}kB", s, with_resv=True) for s in sizes)


def meminfo(fs: HostFs, rel: str) -> dict[str, int]:
    """/proc/meminfo or a node's meminfo ("Node 0 MemTotal:  123 kB") as {key: kB}."""
    out: dict[str, int] = {}
    for line in fs.lines(rel):
        if m := _MEMINFO.match(line.strip()):
            out[m.group(1)] = int(m.group(2))
    return out


def node_ids(fs: HostFs) -> list[int]:
    return sorted(int(m.group(1)) for n in fs.listdir(NODE_DIR) if (m := _NODE_NAME.match(n)))


def read_nodes(fs: HostFs, sizes: tuple[int, ...], all_cpus: list[int]) -> tuple[NumaNode, ...]:
    """One ``NumaNode`` per nodeN directory.

    A kernel without CONFIG_NUMA has no node directories: then one node 0 is
    reported with every CPU, /proc/meminfo's memory and the host-wide pools,
    and a warning says so.
    """
    ids = node_ids(fs)
    if not ids:
        fs.warn(f"{fs.show(NODE_DIR)}: no NUMA node directories; reporting one node 0 "
                "from /proc/meminfo")
        mi = meminfo(fs, "proc/meminfo")
        pools = tuple(HugepagePool(p.size_kb, p.total, p.free, p.surplus) for p in global_pools(fs, sizes))
        return (NumaNode(0, tuple(all_cpus), mi.get("MemTotal", 0), mi.get("MemFree", 0), pools),)
    out = []
    for nid in ids:
        d = f"{NODE_DIR}/node{nid}"
        cpus = fs.cpu_list(f"{d}/cpulist")
        mi = meminfo(fs, f"{d}/meminfo")
        for key in ("MemTotal", "MemFree"):
            if key not in mi:
                fs.warn(f"{fs.show(d)}/meminfo: no {key}; reported as 0")
        node_sizes = {int(m.group(1)) for n in fs.listdir(f"{d}/hugepages") if (m := _HP_NAME.match(n))}
        pools = tuple(_pool(fs, f"{d}/hugepages/hugepages-{s}kB", s, with_resv=False)
                      for s in sorted(node_sizes))
        missing = sorted(set(sizes) - node_sizes)
        if missing:
            fs.warn(f"node{nid}: no per-node pool for {', '.join(f'{s} kB' for s in missing)}")
        dist = fs.text(f"{d}/distance")
        try:
            distances = tuple(int(x) for x in dist.split()) if dist else ()
        except ValueError:
            fs.warn(f"{fs.show(d)}/distance: not a list of integers")
            distances = ()
        out.append(NumaNode(nid, tuple(sorted(cpus or ())), mi.get("MemTotal", 0),
                            mi.get("MemFree", 0), pools, distances))
    return tuple(out)


def parse_size_kb(text: str) -> int | None:
    """"2M" -> 2048, "1G" / "1024M" -> 1048576, "2048K" -> 2048, bare bytes -> kB."""
    m = _SIZE.match(text.strip())
    if not m:
        return None
    n, unit = int(m.group(1)), m.group(2).upper()
    return {"K": n, "M": n * 1024, "G": n * 1024 * 1024, "": n // 1024}[unit]


def hugetlbfs_mounts(fs: HostFs, default_kb: int | None) -> tuple[HugetlbfsMount, ...]:
    """hugetlbfs mounts from /proc/mounts; a mount without pagesize= uses the
    default hugepage size (/proc/meminfo Hugepagesize)."""
    out = []
    for line in fs.lines("proc/mounts"):
        f = line.split()
        if len(f) < 4 or f[2] != "hugetlbfs":
            continue
        size = default_kb
        for opt in f[3].split(","):
            if opt.startswith("pagesize="):
                size = parse_size_kb(opt.partition("=")[2])
        if size is None:
            fs.warn(f"hugetlbfs at {f[1]}: page size unknown; reported as 0")
        out.append(HugetlbfsMount(unescape_mount(f[1]), size or 0))
    return tuple(out)


def unescape_mount(field: str) -> str:
    """/proc/mounts and mountinfo escape space, tab, newline and backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
