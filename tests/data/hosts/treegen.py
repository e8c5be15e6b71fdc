"""Writer of recorded host trees: compact descriptions (dataclasses) -> sysfs/procfs files.

Used by make_trees.py, which holds the descriptions of each host shape. The
layouts follow a real Linux 6.1 kernel (Debian 12): see make_trees.py.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

GIB_KB = 1024 * 1024

# ---------------------------------------------------------------- descriptions


@dataclass
class CpuDesc:
    vendor: str
    model_name: str
    family: int
    model: int
    flags: str
    sockets: int
    cores: tuple[int, ...]  # core_id values of one socket, in enumeration order
    threads: int
    nodes_per_socket: int = 1


@dataclass
class NodeDesc:
    mem_total_kb: int
    mem_free_kb: int
    pools: dict[int, tuple[int, int, int]]  # size_kb -> (nr, free, surplus)
    distance: tuple[int, ...]


@dataclass
class VfDesc:
    pci: str
    driver: str | None
    netdev: str | None = None
    mac: str | None = None


@dataclass
class NicDesc:
    name: str
    pci_path: str  # "pci0000:3a/0000:3a:00.0/0000:3b:00.0"
    driver: str
    numa_node: int
    speed: int  # what /sys/class/net/X/speed says (-1: unknown/down)
    mac: str
    totalvfs: int | None = None  # None: not SR-IOV capable (no sriov_* files)
    vfs: tuple[VfDesc, ...] = ()


@dataclass
class PartDesc:
    name: str
    devnum: str
    sectors: int
    holders: tuple[str, ...] = ()


@dataclass
class DiskDesc:
    name: str
    devnum: str
    sectors: int
    # sysfs parent of the block dir, relative to /sys/devices; the block device is
    # <parent>/block/<name> (SCSI: the scsi device; NVMe: <pci>/nvme/nvmeN)
    parent: str
    rotational: int = 0
    ro: int = 0
    removable: int = 0
    model: str | None = None  # device/model
    wwid: str | None = None  # SCSI device/wwid or NVMe <block>/wwid
    serial: str | None = None  # NVMe controller serial (device/serial)
    numa_node: int | None = None  # on the PCI function that <parent> hangs off
    pci: str | None = None  # that PCI function, relative to /sys/devices
    parts: tuple[PartDesc, ...] = ()
    holders: tuple[str, ...] = ()
    by_id: tuple[str, ...] = ()  # /dev/disk/by-id names (with udev)
    udev: dict[str, str] = field(default_factory=dict)  # E: properties (with udev)
    backing_file: str | None = None  # loop
    virtual: bool = False  # lives under /sys/devices/virtual/block
    # Linux 6.11+ queue limits (unit_min, unit_max, boundary, max) in bytes; None: a
    # kernel without the atomic_write_* files
    atomic: tuple[int, int, int, int] | None = None


@dataclass
class StackDesc:
    """An md or dm device: what it sits on (slaves) and its identity."""

    name: str
    devnum: str
    sectors: int
    slaves: tuple[str, ...]
    md_level: str | None = None
    dm_name: str | None = None
    dm_uuid: str | None = None


@dataclass
class MountDesc:
    devnum: str
    mountpoint: str
    fstype: str
    source: str
    options: str = "rw,relatime"


@dataclass
class HostDesc:
    name: str
    hostname: str
    kernel: str
    cpu: CpuDesc
    nodes: tuple[NodeDesc, ...]
    sizes: tuple[int, ...]
    resv: dict[int, int]
    hugepagesize_kb: int
    isolated: str = ""
    nohz_full: str | None = None  # None: kernel without CONFIG_NO_HZ_FULL (no file)
    cgroup: str = "v2"
    v2_controllers: str = "cpuset cpu io memory hugetlb pids rdma misc"
    nics: tuple[NicDesc, ...] = ()
    disks: tuple[DiskDesc, ...] = ()
    stacks: tuple[StackDesc, ...] = ()
    mounts: tuple[MountDesc, ...] = ()
    swaps: tuple[str, ...] = ()
    udev: bool = False  # /run/udev/data files
    by_id_dir: bool = False  # /dev/disk/by-id links
    probe: dict = field(default_factory=dict)
    # Recorded `nvme id-ns|id-ctrl -o json` output: file name under .hostd-probe/nvme -> JSON
    nvme_json: dict[str, dict] = field(default_factory=dict)


# ---------------------------------------------------------------- derived topology


def cpu_layout(c: CpuDesc) -> list[dict]:
    """Linux enumeration order on Intel and AMD server parts: every core's first
    thread, socket by socket, then every core's second thread (cpu N and
    N + sockets*cores are siblings)."""
    ncores = len(c.cores)
    total = c.sockets * ncores
    per_node = ncores // c.nodes_per_socket
    out = []
    for cpu in range(total * c.threads):
        thread, g = divmod(cpu, total)
        socket, i = divmod(g, ncores)
        out.append({
            "id": cpu, "socket": socket, "core": c.cores[i],
            "node": socket * c.nodes_per_socket + i // per_node,
            "siblings": [t * total + g for t in range(c.threads)],
        })
    return out


def cpulist(ids: list[int]) -> str:
    ids = sorted(ids)
    out, start = [], None
    for i, c in enumerate(ids):
        if start is None:
            start = c
        if i + 1 == len(ids) or ids[i + 1] != c + 1:
            out.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(out)


# ---------------------------------------------------------------- writer


class Tree:
    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, rel: str, text: str) -> None:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text if text.endswith("\n") or text == "" else text + "\n")

    def link(self, rel: str, target: str) -> None:
        """A relative symlink at ``rel`` to ``target`` (both relative to the root)."""
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(self.root / target, p.parent), p)


def write_host(h: HostDesc, out: Path) -> None:
    root = out / h.name
    if root.exists():
        shutil.rmtree(root)
    t = Tree(root)
    cpus = cpu_layout(h.cpu)
    _kernel(t, h)
    _cpuinfo(t, h, cpus)
    _cpus(t, h, cpus)
    _nodes(t, h, cpus)
    for nic in h.nics:
        _nic(t, nic)
    for d in h.disks:
        _disk(t, h, d)
    for s in h.stacks:
        _stack(t, h, s)
    _mounts(t, h)
    if h.probe:
        t.write(".hostd-probe.json", json.dumps(h.probe, indent=2, sort_keys=True))
    for fname, data in sorted(h.nvme_json.items()):
        t.write(f".hostd-probe/nvme/{fname}", json.dumps(data, indent=2))


def _kernel(t: Tree, h: HostDesc) -> None:
    t.write("proc/sys/kernel/hostname", h.hostname)
    t.write("proc/sys/kernel/osrelease", h.kernel)
    t.write("proc/sys/kernel/arch", "x86_64")
    total = sum(n.mem_total_kb for n in h.nodes)
    free = sum(n.mem_free_kb for n in h.nodes)
    t.write("proc/meminfo", f"MemTotal:       {total} kB\nMemFree:        {free} kB\n"
                            f"Hugepagesize:       {h.hugepagesize_kb} kB\n")


def _cpuinfo(t: Tree, h: HostDesc, cpus: list[dict]) -> None:
    c = h.cpu
    blocks = []
    for cpu in cpus:
        blocks.append("\n".join([
            f"processor\t: {cpu['id']}", f"vendor_id\t: {c.vendor}", f"cpu family\t: {c.family}",
            f"model\t\t: {c.model}", f"model name\t: {c.model_name}",
            f"physical id\t: {cpu['socket']}", f"siblings\t: {len(c.cores) * c.threads}",
            f"core id\t\t: {cpu['core']}", f"cpu cores\t: {len(c.cores)}", f"flags\t\t: {c.flags}",
        ]) + "\n")
    t.write("proc/cpuinfo", "\n".join(blocks))


def _cpus(t: Tree, h: HostDesc, cpus: list[dict]) -> None:
    base = "sys/devices/system/cpu"
    all_ids = cpulist([c["id"] for c in cpus])
    for f in ("online", "possible", "present"):
        t.write(f"{base}/{f}", all_ids)
    t.write(f"{base}/isolated", h.isolated)
    if h.nohz_full is not None:
        t.write(f"{base}/nohz_full", h.nohz_full)
    for c in cpus:
        d = f"{base}/cpu{c['id']}/topology"
        t.write(f"{d}/core_id", str(c["core"]))
        t.write(f"{d}/physical_package_id", str(c["socket"]))
        t.write(f"{d}/thread_siblings_list", cpulist(c["siblings"]))


def _nodes(t: Tree, h: HostDesc, cpus: list[dict]) -> None:
    base = "sys/devices/system/node"
    t.write(f"{base}/online", cpulist(list(range(len(h.nodes)))))
    glob: dict[int, list[int]] = {s: [0, 0, 0] for s in h.sizes}
    for nid, n in enumerate(h.nodes):
        d = f"{base}/node{nid}"
        t.write(f"{d}/cpulist", cpulist([c["id"] for c in cpus if c["node"] == nid]))
        t.write(f"{d}/distance", " ".join(map(str, n.distance)))
        used = n.mem_total_kb - n.mem_free_kb
        t.write(f"{d}/meminfo", "".join(
            f"Node {nid} {k}:{v:>16} kB\n" for k, v in
            (("MemTotal", n.mem_total_kb), ("MemFree", n.mem_free_kb), ("MemUsed", used))))
        for size in h.sizes:
            nr, free, surplus = n.pools.get(size, (0, 0, 0))
            p = f"{d}/hugepages/hugepages-{size}kB"
            t.write(f"{p}/nr_hugepages", str(nr))
            t.write(f"{p}/free_hugepages", str(free))
            t.write(f"{p}/surplus_hugepages", str(surplus))
            for i, v in enumerate((nr, free, surplus)):
                glob[size][i] += v
    for size, (nr, free, surplus) in glob.items():
        p = f"sys/kernel/mm/hugepages/hugepages-{size}kB"
        t.write(f"{p}/nr_hugepages", str(nr))
        t.write(f"{p}/free_hugepages", str(free))
        t.write(f"{p}/surplus_hugepages", str(surplus))
        t.write(f"{p}/resv_hugepages", str(h.resv.get(size, 0)))


def _nic(t: Tree, n: NicDesc) -> None:
    pf = f"sys/devices/{n.pci_path}"
    parent = pf.rsplit("/", 1)[0]
    t.write(f"{pf}/numa_node", str(n.numa_node))
    t.link(f"{pf}/driver", f"sys/bus/pci/drivers/{n.driver}")
    net = f"{pf}/net/{n.name}"
    t.write(f"{net}/address", n.mac)
    t.write(f"{net}/speed", str(n.speed))
    t.link(f"{net}/device", pf)
    t.link(f"sys/class/net/{n.name}", net)
    if n.totalvfs is None:
        return
    t.write(f"{pf}/sriov_totalvfs", str(n.totalvfs))
    t.write(f"{pf}/sriov_numvfs", str(len(n.vfs)))
    for i, vf in enumerate(n.vfs):
        vdir = f"{parent}/{vf.pci}"
        t.link(f"{pf}/virtfn{i}", vdir)
        t.link(f"{vdir}/physfn", pf)
        t.write(f"{vdir}/numa_node", str(n.numa_node))
        if vf.driver:
            t.link(f"{vdir}/driver", f"sys/bus/pci/drivers/{vf.driver}")
        if vf.netdev:
            vnet = f"{vdir}/net/{vf.netdev}"
            t.write(f"{vnet}/address", vf.mac or "")
            t.write(f"{vnet}/speed", str(n.speed))
            t.link(f"{vnet}/device", vdir)
            t.link(f"sys/class/net/{vf.netdev}", vnet)


def _block_dir(d: DiskDesc | StackDesc) -> str:
    if isinstance(d, StackDesc) or d.virtual:
        return f"sys/devices/virtual/block/{d.name}"
    return f"sys/devices/{d.parent}/block/{d.name}"


def _disk(t: Tree, h: HostDesc, d: DiskDesc) -> None:
    b = _block_dir(d)
    t.link(f"sys/block/{d.name}", b)
    t.write(f"{b}/dev", d.devnum)
    t.write(f"{b}/size", str(d.sectors))
    t.write(f"{b}/ro", str(d.ro))
    t.write(f"{b}/removable", str(d.removable))
    t.write(f"{b}/queue/rotational", str(d.rotational))
    if d.atomic is not None:
        for key, v in zip(("atomic_write_unit_min_bytes", "atomic_write_unit_max_bytes",
                           "atomic_write_boundary_bytes", "atomic_write_max_bytes"), d.atomic):
            t.write(f"{b}/queue/{key}", str(v))
    if d.backing_file:
        t.write(f"{b}/loop/backing_file", d.backing_file)
    if not d.virtual:
        dev = f"sys/devices/{d.parent}"
        t.link(f"{b}/device", dev)
        if d.model:
            t.write(f"{dev}/model", d.model.ljust(16) if not d.name.startswith("nvme") else d.model)
        if d.name.startswith("nvme"):
            if d.wwid:
                t.write(f"{b}/wwid", d.wwid)
            if d.serial:
                t.write(f"{dev}/serial", d.serial.ljust(20))
        elif d.wwid:
            t.write(f"{dev}/wwid", d.wwid)
    if d.pci is not None and d.numa_node is not None:
        t.write(f"sys/devices/{d.pci}/numa_node", str(d.numa_node))
    for hname in d.holders:
        t.link(f"{b}/holders/{hname}", f"sys/devices/virtual/block/{hname}")
    for p in d.parts:
        pd = f"{b}/{p.name}"
        t.write(f"{pd}/dev", p.devnum)
        t.write(f"{pd}/partition", p.name.rsplit("p", 1)[-1] if d.name.startswith("nvme")
                else p.name.removeprefix(d.name))
        t.write(f"{pd}/size", str(p.sectors))
        for hname in p.holders:
            t.link(f"{pd}/holders/{hname}", f"sys/devices/virtual/block/{hname}")
    if h.by_id_dir:
        for link in d.by_id:
            t.link(f"dev/disk/by-id/{link}", f"dev/{d.name}")
        for p in d.parts:
            for link in d.by_id:
                t.link(f"dev/disk/by-id/{link}-part{p.name.removeprefix(d.name).lstrip('p')}",
                       f"dev/{p.name}")
    if h.udev and d.udev:
        lines = [f"S:disk/by-id/{s}" for s in d.by_id] + [f"E:{k}={v}" for k, v in d.udev.items()]
        t.write(f"run/udev/data/b{d.devnum}", "\n".join(lines))


def _stack(t: Tree, h: HostDesc, s: StackDesc) -> None:
    b = _block_dir(s)
    t.link(f"sys/block/{s.name}", b)
    t.write(f"{b}/dev", s.devnum)
    t.write(f"{b}/size", str(s.sectors))
    t.write(f"{b}/ro", "0")
    t.write(f"{b}/removable", "0")
    t.write(f"{b}/queue/rotational", "0")
    if s.md_level:
        t.write(f"{b}/md/level", s.md_level)
    if s.dm_name:
        t.write(f"{b}/dm/name", s.dm_name)
        t.write(f"{b}/dm/uuid", s.dm_uuid or "")
    for slave in s.slaves:
        t.link(f"{b}/slaves/{slave}", _slave_dir(h, slave))


def _slave_dir(h: HostDesc, name: str) -> str:
    for d in h.disks:
        if d.name == name:
            return _block_dir(d)
        for p in d.parts:
            if p.name == name:
                return f"{_block_dir(d)}/{p.name}"
    raise KeyError(name)


def _mounts(t: Tree, h: HostDesc) -> None:
    std = [MountDesc("0:21", "/proc", "proc", "proc"), MountDesc("0:20", "/sys", "sysfs", "sysfs"),
           MountDesc("0:5", "/dev", "devtmpfs", "udev")]
    if h.cgroup == "v2":
        std.append(MountDesc("0:26", "/sys/fs/cgroup", "cgroup2", "cgroup2",
                             "rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot"))
        t.write("sys/fs/cgroup/cgroup.controllers", h.v2_controllers)
    else:
        std.append(MountDesc("0:26", "/sys/fs/cgroup", "tmpfs", "tmpfs", "ro,nosuid,nodev,noexec,mode=755"))
        for i, ctl in enumerate(("cpuset", "cpu,cpuacct", "memory", "hugetlb")):
            std.append(MountDesc(f"0:{27 + i}", f"/sys/fs/cgroup/{ctl}", "cgroup", "cgroup",
                                 f"rw,nosuid,nodev,noexec,relatime,{ctl}"))
    mounts = [m for m in h.mounts if m.mountpoint == "/"] + std + \
        [m for m in h.mounts if m.mountpoint != "/"]
    info, plain = [], []
    for i, m in enumerate(mounts):
        mid = 20 + i
        parent = 1 if m.mountpoint == "/" else 20
        info.append(f"{mid} {parent} {m.devnum} / {m.mountpoint} {m.options} shared:{i + 1} - "
                    f"{m.fstype} {m.source} rw")
        plain.append(f"{m.source} {m.mountpoint} {m.fstype} {m.options} 0 0")
    t.write("proc/self/mountinfo", "\n".join(info))
    t.write("proc/mounts", "\n".join(plain))
    rows = ["Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority"]
    rows += [f"{s}{' ' * max(1, 40 - len(s))}partition\t16777212\t0\t\t-2" for s in h.swaps]
    t.write("proc/swaps", "\n".join(rows))
