"""Human output of a plan: what `hostd plan` and `hostd carve` print."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from api.layout import Layout
from hostd.cpulist import format_cpu_list
from hostd.errors import NoFit


def _cpus(cpus: tuple[int, ...]) -> str:
    return format_cpu_list(cpus) if cpus else "-"


def _pages(size_kb: int, count: int) -> str:
    label = f"{size_kb // (1024 * 1024)}G" if size_kb >= 1024 * 1024 else f"{size_kb // 1024}M"
    return f"{count} x {label} ({size_kb * count // 1024} MiB)"


def render_layout(layout: Layout, console: Console) -> None:
    t = Table(title="host layout per NUMA node", title_justify="left")
    for col in ("node", "io_cpus", "host_cpus", "vm_cpus", "hugepages for VMs"):
        t.add_column(col)
    for n in layout.nodes:
        t.add_row(str(n.node), _cpus(n.io_cpus), _cpus(n.host_cpus), _cpus(n.vm_cpus),
                  ", ".join(_pages(h.size_kb, h.count) for h in n.hugepages) or "-")
    console.print(t)
    io = layout.io_service
    console.print(f"IO service: {io.kind} {io.name}".rstrip() + f" -> CPUs {_cpus(layout.io_cpus)}; "
                  f"VM cgroup: {layout.vm_cgroup} -> CPUs {_cpus(layout.vm_cpus)}", highlight=False,
                  markup=False)
    if layout.pfs:
        p = Table(title="SR-IOV PFs", title_justify="left")
        for col in ("pf", "pci", "node", "vfs", "budget Mbit/s", "per-VF max/min Mbit/s"):
            p.add_column(col)
        for pf in layout.pfs:
            rate = f"{pf.slots[0].max_tx_rate_mbps or '-'}/{pf.slots[0].min_tx_rate_mbps or '-'}" if pf.slots else "-"
            p.add_row(pf.name, pf.pci, "-" if pf.node is None else str(pf.node), str(pf.numvfs),
                      str(pf.bandwidth_mbps), rate)
        console.print(p)
    d = Table(title="disks VMs may use", title_justify="left")
    for col in ("disk", "id", "node", "size", "budget bytes/s", "budget IOPS"):
        d.add_column(col)
    for disk in layout.disks:
        d.add_row(disk.name, disk.id or "-", "-" if disk.node is None else str(disk.node),
                  f"{disk.size_bytes / 2**30:.1f} GiB", str(disk.bytes_sec or "unlimited"),
                  str(disk.iops or "unlimited"))
    if layout.disks:
        console.print(d)
    else:
        console.print("disks VMs may use: none (check disks.allow)")
    if layout.reboot_required:
        console.print("[bold]needs a reboot[/bold] (kernel command line; not applied by carve):")
        for b in layout.reboot_required:
            console.print(f"  {b.param}={b.value}  -- {b.why}", highlight=False, markup=False)
    for w in layout.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)


def render_nofit(nofit: NoFit, console: Console) -> None:
    console.print(f"[red]does not fit:[/red] {escape(nofit.field)}: {escape(nofit.reason)}", highlight=False)
