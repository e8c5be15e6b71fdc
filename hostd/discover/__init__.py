"""hostd discover: the host as it is, read from /sys, /proc, /dev and udev.

Readers take a root path (``HostFs``): "/" is this machine, any other directory
a recorded host tree (tests/data/hosts/). Nothing here decides anything: the
carve planner does. Nothing raises on an odd host either: a missing or malformed
file becomes None/empty plus a line in ``host.warnings``.
The JSON form is the interface documented in api/topology.md.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from hostd.discover.cpus import cpu_ids, isolated_cpus, nohz_full_cpus, read_cpus
from hostd.discover.disks import read_disks
from hostd.discover.fs import HostFs
from hostd.discover.host import (
    cgroup_version,
    kvm_info,
    read_arch,
    read_cpuinfo,
    versions,
    virt_warnings,
)
from hostd.discover.memory import (
    global_pools,
    hugepage_sizes,
    hugetlbfs_mounts,
    meminfo,
    read_nodes,
)
from hostd.discover.model import HostInfo, Topology
from hostd.discover.nics import read_nics
from hostd.discover.udev import udev_source

log = logging.getLogger(__name__)

VIRT_TYPES = ("kvm", "qemu")


def discover_host(root: Path, *, allow: tuple[str, ...] = (), virt_type: str = "kvm",
                  probe_versions: bool = False, wipe_ok: tuple[str, ...] = ()) -> Topology:
    """Read the host under ``root``.

    ``allow``: disk allow-list (names, /dev paths, stable ids, fnmatch globs); a
    disk that matches none is not assignable. ``virt_type``: what hostd will run
    guests with ("kvm" or "qemu"), checked against the CPU and /dev/kvm.
    ``probe_versions``: run virsh / qemu-system-* for their versions.
    ``wipe_ok``: disks (same patterns) whose signatures the operator lets VMs overwrite.
    """
    if virt_type not in VIRT_TYPES:
        raise ValueError(f"virt_type must be one of {VIRT_TYPES}, not {virt_type!r}")
    fs = HostFs(root)
    if not fs.root.is_dir():
        fs.warn(f"root {fs.root} is not a directory: nothing to read")
    cpu_model = read_cpuinfo(fs)
    sizes = hugepage_sizes(fs)
    nodes = read_nodes(fs, sizes, cpu_ids(fs))
    node_of = {c: n.id for n in nodes for c in n.cpus}
    cpus = read_cpus(fs, node_of)
    nics = read_nics(fs)
    disks = read_disks(fs, udev_source(fs), tuple(allow), wipe_ok=tuple(wipe_ok))
    kvm = kvm_info(fs, cpu_model.flags)
    arch = read_arch(fs)
    libvirt_v, qemu_v = versions(fs, arch, probe_versions)
    default_kb = meminfo(fs, "proc/meminfo").get("Hugepagesize")
    host = HostInfo(
        hostname=fs.text("proc/sys/kernel/hostname") or "unknown",
        kernel=fs.text("proc/sys/kernel/osrelease") or "unknown",
        arch=arch,
        cpu_vendor=cpu_model.vendor,
        cpu_model=cpu_model.model,
        hugepage_sizes_kb=sizes,
        pdpe1gb="pdpe1gb" in cpu_model.flags,
        hugetlbfs_mounts=hugetlbfs_mounts(fs, default_kb),
        isolated_cpus=tuple(sorted(isolated_cpus(fs))),
        nohz_full_cpus=tuple(sorted(nohz_full_cpus(fs))),
        cgroup_version=cgroup_version(fs),
        kvm=kvm,
        virt_type=virt_type,
        warnings=(),
        libvirt_version=libvirt_v,
        qemu_version=qemu_v,
        hugepages=global_pools(fs, sizes),
    )
    warnings = tuple(virt_warnings(kvm, virt_type) + fs.warnings)
    for w in warnings:
        log.info("discover warning=%r", w)
    return Topology(replace(host, warnings=warnings), cpus, nodes, nics, disks)


class DiskProbe:
    """Why one disk may not go to a VM *now*, read from the host under ``root``: the
    VM manager asks right before it hands the disk over (the carve-time answer may
    be stale: mounted since, swapped on, grabbed by MD/LVM). Reads that disk only."""

    def __init__(self, root: Path, allow: tuple[str, ...], wipe_ok: tuple[str, ...] = ()):
        self.root = root
        self.allow = allow
        self.wipe_ok = wipe_ok

    def __call__(self, name: str) -> list[str]:
        fs = HostFs(self.root)
        disks = read_disks(fs, udev_source(fs), self.allow, only=name, wipe_ok=self.wipe_ok)
        if not disks:
            return [f"{name} is gone from the host"]
        return list(disks[0].reasons) + list(disks[0].handover)
