"""Human output of `hostd discover`: host facts and warnings, then CPUs per node
(one row per core, siblings together, as ``lscpu -e`` would group them), NUMA
nodes with their hugepage pools, SR-IOV NICs and VFs, disks (as ``lsblk`` with
why each is or is not assignable)."""

from __future__ import annotations

from itertools import groupby

from rich.console import Console
from rich.table import Table

from hostd.cpulist import format_cpu_list
from hostd.discover.model import Cpu, Disk, HugepagePool, Nic, NumaNode, Topology

GIB_KB = 1024 * 1024


def size_label(kb: int) -> str:
    return f"{kb // GIB_KB}G" if kb >= GIB_KB and kb % GIB_KB == 0 else f"{kb // 1024}M"


def human_bytes(n: int) -> str:
    """Binary units, as lsblk prints them ("256G", "7.3T")."""
    for unit, div in (("T", 2**40), ("G", 2**30), ("M", 2**20)):
        if n >= div:
            v = n / div
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{n}B"


def _dash(v: object) -> str:
    return "-" if v is None or v == "" or v == () else str(v)


def _cpus(c: tuple[int, ...]) -> str:
    return format_cpu_list(c) if c else "-"


def _host(topo: Topology, console: Console) -> None:
    h = topo.host
    t = Table(title=f"host {h.hostname}", title_justify="left", show_header=False, box=None,
              padding=(0, 2, 0, 0))
    t.add_column(style="bold")
    t.add_column()
    kvm = h.kvm
    kvm_state = "usable" if kvm.usable else "present, not usable" if kvm.present else "absent"
    rows = [
        ("kernel", f"{h.kernel} ({h.arch})"),
        ("cpu", f"{h.cpu_vendor} {h.cpu_model}"),
        ("virt type", f"{h.virt_type}  (/dev/kvm {kvm_state}; full guests under KVM: "
                      f"{'yes' if kvm.full_guest_ok else 'no'})"),
        ("kvm", kvm.detail),
        ("libvirt / qemu", f"{_dash(h.libvirt_version)} / {_dash(h.qemu_version)}"),
        ("cgroup (cpuset)", f"v{h.cgroup_version}"),
        ("isolated cpus", _cpus(h.isolated_cpus)),
        ("nohz_full cpus", _cpus(h.nohz_full_cpus)),
        ("hugepage sizes", (", ".join(size_label(s) for s in h.hugepage_sizes_kb) or "none")
         + ("" if h.pdpe1gb else "  (CPU lacks pdpe1gb: no 1G pages)")),
        ("hugetlbfs", ", ".join(f"{m.path} ({size_label(m.pagesize_kb)})" for m in h.hugetlbfs_mounts)
         or "not mounted"),
    ]
    for p in h.hugepages:
        rows.append((f"pool {size_label(p.size_kb)}", f"total {p.total}, free {p.free}, "
                     f"reserved {_dash(p.reserved)}, surplus {p.surplus}"))
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    for w in h.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}", highlight=False)


def _cpu_table(topo: Topology, console: Console) -> None:
    online = sum(c.online for c in topo.cpus)
    t = Table(title=f"CPUs: {len(topo.cpus)} ({online} online), one row per core",
              title_justify="left")
    for col in ("node", "socket", "core", "cpus (SMT siblings)", "online", "isolated", "nohz_full"):
        t.add_column(col, justify="right" if col in ("node", "socket", "core") else "left")

    def core_key(c: Cpu) -> tuple[int, int, int, tuple[int, ...]]:
        return (c.node, c.socket, c.core, c.siblings if c.core >= 0 else (c.id,))

    for (node, socket, core, _), group in groupby(sorted(topo.cpus, key=core_key), key=core_key):
        cs = list(group)
        ids = tuple(sorted(x for c in cs for x in (c.siblings if c.online else (c.id,))))
        t.add_row(str(node), "?" if socket < 0 else str(socket), "?" if core < 0 else str(core),
                  format_cpu_list(ids), _flags(cs, "online"), _flags(cs, "isolated"),
                  _flags(cs, "nohz_full"))
    console.print(t)


def _flags(cs: list[Cpu], attr: str) -> str:
    vals = {getattr(c, attr) for c in cs}
    if vals == {True}:
        return "yes"
    if vals == {False}:
        return "no" if attr == "online" else ""
    return format_cpu_list(c.id for c in cs if getattr(c, attr))


def _pool(p: HugepagePool) -> str:
    s = f"{size_label(p.size_kb)}: {p.free}/{p.total} free"
    return s + (f", {p.surplus} surplus" if p.surplus else "")


def _node_table(nodes: tuple[NumaNode, ...], console: Console) -> None:
    t = Table(title="NUMA nodes", title_justify="left")
    for col in ("node", "cpus", "memory", "free", "hugepages (free/total per size)", "distances"):
        t.add_column(col)
    for n in nodes:
        t.add_row(str(n.id), _cpus(n.cpus), f"{n.memory_total_kb / GIB_KB:.1f} GiB",
                  f"{n.memory_free_kb / GIB_KB:.1f} GiB", "; ".join(_pool(p) for p in n.hugepages) or "-",
                  " ".join(map(str, n.distances)) or "-")
    console.print(t)


def _nic_tables(nics: tuple[Nic, ...], console: Console) -> None:
    if not nics:
        console.print("NICs: none backed by a PCI function")
        return
    t = Table(title="NICs (PCI); SR-IOV VFs as numvfs/totalvfs", title_justify="left")
    for col in ("nic", "pci", "driver", "node", "speed", "mac", "VFs"):
        t.add_column(col)
    for n in nics:
        t.add_row(n.name, n.pci, _dash(n.driver), _dash(n.node),
                  f"{n.speed_mbps} Mb/s" if n.speed_mbps else "down/unknown", _dash(n.mac),
                  f"{n.sriov_numvfs}/{n.sriov_totalvfs}" if n.sriov_totalvfs else "no SR-IOV")
    console.print(t)
    for n in nics:
        if not n.vfs:
            continue
        v = Table(title=f"VFs of {n.name} ({n.pci})", title_justify="left")
        for col in ("vf", "pci", "driver", "netdev", "mac"):
            v.add_column(col)
        for vf in n.vfs:
            v.add_row(str(vf.index), vf.pci, _dash(vf.driver), _dash(vf.netdev), _dash(vf.mac))
        console.print(v)


def _disk_table(disks: tuple[Disk, ...], console: Console) -> None:
    if not disks:
        console.print("disks: none")
        return
    free = sum(d.assignable for d in disks)
    t = Table(title=f"disks: {len(disks)} ({free} assignable to VMs)", title_justify="left")
    for col in ("disk", "id", "size", "type", "node", "partitions", "holders", "mounts", "atomic", "assignable"):
        t.add_column(col, overflow="fold")
    for d in disks:
        kind = ("loop" if d.backing_file else "zram" if d.name.startswith("zram")
                else "hdd" if d.rotational else "ssd")
        flags = [x for x, on in (("ro", d.readonly), ("rm", d.removable), ("swap", d.swap)) if on]
        verdict = "[green]yes[/green]" if d.assignable else "[red]no[/red]: " + "; ".join(d.reasons)
        t.add_row(d.name, _dash(d.id or d.backing_file), human_bytes(d.size_bytes),
                  " ".join([kind, *flags]), _dash(d.node), ",".join(d.partitions) or "-",
                  ",".join(d.holders) or "-", ",".join(d.mountpoints) or "-", _atomic(d), verdict)
    console.print(t)


def _atomic(d: Disk) -> str:
    """The device's atomic-write unit ("16K" or "16K/b4K" with a boundary), "0" for none,
    "?" when unknown; what a VM is offered is the plan's (hostd plan)."""
    a = d.atomic
    if a is None:
        return "?"
    if not a.unit_max_bytes:
        return "0"
    def k(n: int) -> str:
        return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else f"{n}B"
    return f"{k(a.unit_max_bytes)}/b{k(a.boundary_bytes)}" if a.boundary_bytes else k(a.unit_max_bytes)


def render_topology(topo: Topology, console: Console) -> None:
    _host(topo, console)
    _cpu_table(topo, console)
    _node_table(topo.nodes, console)
    _nic_tables(topo.nics, console)
    _disk_table(topo.disks, console)
