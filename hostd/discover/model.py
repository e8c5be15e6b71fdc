"""The host as discovered: frozen dataclasses, and their JSON form.

The JSON form (``Topology.to_json()``) is an interface, documented in
``api/topology.md``: the carve planner reads it back with ``Topology.from_json``
and the scheduler ingests it. Field names here are the JSON keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from api.jsonmodel import from_jsonable, to_jsonable

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class KvmInfo:
    """What /dev/kvm offers and what hostd will use."""

    present: bool  # /dev/kvm exists
    usable: bool  # KVM_GET_API_VERSION answered 12 through an open fd
    api_version: int | None
    full_guest_ok: bool  # hardware VMX/SVM in /proc/cpuinfo (a PVM-style hypervisor lacks it)
    detail: str  # one line saying why, for humans


@dataclass(frozen=True)
class HugetlbfsMount:
    path: str
    pagesize_kb: int


@dataclass(frozen=True)
class HostInfo:
    hostname: str
    kernel: str
    arch: str
    cpu_vendor: str  # "GenuineIntel", "AuthenticAMD", ...
    cpu_model: str
    hugepage_sizes_kb: tuple[int, ...]  # what the kernel offers (/sys/kernel/mm/hugepages)
    pdpe1gb: bool  # CPU flag for 1 GiB pages
    hugetlbfs_mounts: tuple[HugetlbfsMount, ...]
    isolated_cpus: tuple[int, ...]  # /sys/devices/system/cpu/isolated
    nohz_full_cpus: tuple[int, ...]  # /sys/devices/system/cpu/nohz_full
    cgroup_version: int  # 1 or 2 (cpuset controller's hierarchy)
    kvm: KvmInfo
    virt_type: str  # "kvm" or "qemu": what hostd will use (config)
    warnings: tuple[str, ...]
    libvirt_version: str | None = None
    qemu_version: str | None = None
    schema_version: int = SCHEMA_VERSION
    # Host-wide pools per size (/sys/kernel/mm/hugepages), the only place the
    # kernel reports ``reserved`` (resv_hugepages).
    hugepages: tuple[HugepagePool, ...] = ()


@dataclass(frozen=True)
class Cpu:
    id: int
    core: int  # topology/core_id (unique only within a package)
    socket: int  # topology/physical_package_id
    node: int  # NUMA node
    siblings: tuple[int, ...]  # SMT siblings including itself (thread_siblings_list)
    online: bool
    isolated: bool
    nohz_full: bool


@dataclass(frozen=True)
class HugepagePool:
    """One hugepage size on one NUMA node (per-node counters; per-node reserved
    is not exported by the kernel, the global value is given on node pools
    as None)."""

    size_kb: int
    total: int  # nr_hugepages
    free: int  # free_hugepages
    surplus: int  # surplus_hugepages
    reserved: int | None = None  # resv_hugepages (global only)


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]
    memory_total_kb: int
    memory_free_kb: int
    hugepages: tuple[HugepagePool, ...]
    distances: tuple[int, ...] = ()


@dataclass(frozen=True)
class Vf:
    index: int  # virtfnN
    pci: str
    driver: str | None
    netdev: str | None  # only when bound to a net driver
    mac: str | None


@dataclass(frozen=True)
class Nic:
    """A network interface backed by a PCI function, with its SR-IOV state."""

    name: str
    pci: str
    driver: str | None
    node: int | None  # None when the kernel reports -1 (no affinity)
    speed_mbps: int | None  # None when link down / unknown
    mac: str | None
    sriov_totalvfs: int  # 0 when not SR-IOV capable
    sriov_numvfs: int
    vfs: tuple[Vf, ...]


@dataclass(frozen=True)
class AtomicWrite:
    """What a disk writes whole even when power fails (hostd/discover/atomic.py says
    where each number comes from). ``unit_max_bytes`` 0: no atomic writes."""

    source: str  # "sysfs" (Linux 6.11+ queue limits) | "nvme-id" (identify data, older kernels)
    unit_min_bytes: int
    unit_max_bytes: int  # a power of two, or 0
    max_bytes: int
    boundary_bytes: int  # an atomic write may not cross a multiple of this; 0 = no boundary
    statx_unit_max_bytes: int | None = None  # statx(STATX_WRITE_ATOMIC) on /dev/NAME; None = not reported
    detail: str = ""  # one line for humans: which fields gave the unit, or why there is none


@dataclass(frozen=True)
class Disk:
    name: str  # kernel name, "sda", "nvme0n1", "loop3"
    id: str | None  # stable id: a /dev/disk/by-id name (api/topology.md); None for loop devices
    wwn: str | None
    serial: str | None
    model: str | None
    size_bytes: int
    rotational: bool
    readonly: bool
    removable: bool
    node: int | None
    partitions: tuple[str, ...]
    holders: tuple[str, ...]  # dm/md/bcache devices using it or any of its partitions
    mountpoints: tuple[str, ...]  # of the disk or any partition
    swap: bool  # the disk or a partition is active swap
    assignable: bool
    reasons: tuple[str, ...]  # why not assignable; empty when assignable
    backing_file: str | None = None  # loop devices only
    # Why it would be refused if handed to a VM right now, checked again at every
    # handover (hostd/discover/diskuse.py): held open by a process, a filesystem /
    # RAID / LVM / partition-table signature (unless the policy's disks.wipe_ok
    # names it). Not part of ``assignable``: a VM's own use makes both true.
    handover: tuple[str, ...] = ()
    # Atomic-write limits; None when neither the kernel nor NVMe identify data tells.
    atomic: AtomicWrite | None = None


@dataclass(frozen=True)
class Topology:
    host: HostInfo
    cpus: tuple[Cpu, ...]
    nodes: tuple[NumaNode, ...]
    nics: tuple[Nic, ...]
    disks: tuple[Disk, ...]

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Topology":
        return from_jsonable(cls, data, "topology")

    @classmethod
    def from_json(cls, text: str) -> "Topology":
        return cls.from_dict(json.loads(text))

    # Lookups used by carve; cheap enough to compute on demand.
    def cpu(self, cpu_id: int) -> Cpu:
        for c in self.cpus:
            if c.id == cpu_id:
                return c
        raise KeyError(cpu_id)

    def node(self, node_id: int) -> NumaNode:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)
