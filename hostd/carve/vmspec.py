"""What a caller asks hostd to run: the VM spec (the gRPC CreateVMRequest as data).

The spec is stored verbatim in the ledger and in the domain's metadata, so a VM
can be re-checked, re-rendered or adopted after a restart from either copy.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api import bounds
from api.jsonmodel import from_jsonable, to_jsonable
from api.states import VfMigration
from hostd.carve.vmclaim import CellReq, DiskReq, VfReq, VmRequest, validate_request
from hostd.errors import NoFit


@dataclass(frozen=True)
class IoTune:
    """QEMU block throttles (libvirt ``<iotune>``); 0 = unset."""

    total_bytes_sec: int = 0
    read_bytes_sec: int = 0
    write_bytes_sec: int = 0
    total_iops_sec: int = 0
    read_iops_sec: int = 0
    write_iops_sec: int = 0
    total_bytes_sec_max: int = 0
    total_iops_sec_max: int = 0
    total_bytes_sec_max_length: int = 0
    total_iops_sec_max_length: int = 0
    group_name: str = ""

    @property
    def bytes_sec(self) -> int:
        """Sustained bandwidth this throttle lets through: what it takes from a disk budget."""
        return self.total_bytes_sec or (self.read_bytes_sec + self.write_bytes_sec)

    @property
    def iops(self) -> int:
        return self.total_iops_sec or (self.read_iops_sec + self.write_iops_sec)

    def check(self, where: str) -> tuple[str, str] | None:
        """(field, reason) when libvirt or QEMU would refuse this throttle, or a value
        is out of bounds (``api.bounds.iotune_problem``, the scheduler's rule too)."""
        bad = bounds.iotune_problem(to_jsonable(self))
        return (f"{where}.{bad[0]}", bad[1]) if bad else None

    def libvirt_params(self) -> dict[str, int | str]:
        """For virDomainSetBlockIoTune: every rate and burst, 0 included, so the disk
        ends with exactly this throttle: libvirt keeps the current value of a field it
        is not given, and a burst left over from the last one would both outlive the
        spec and refuse a later base rate above it. (libvirt's test driver refuses a
        base rate with a burst of 0; the QEMU driver takes 0 as no burst.)"""
        d: dict[str, int | str] = {k: v for k, v in to_jsonable(self).items() if k != "group_name"}
        if self.group_name:
            d["group_name"] = self.group_name
        return d


@dataclass(frozen=True)
class DiskSpec:
    disk: str  # kernel name or stable id of an assignable disk
    iotune: IoTune = IoTune()
    # The guest's name of the disk (its virtio serial); "" = the host disk's kernel name.
    # A migration target sets it: the guest keeps the name it has known the disk by.
    serial: str = ""
    # The guest must write this many bytes whole (0 = no need): only a disk whose layout
    # offers that atomic unit (DiskBudget.atomic_write_bytes) is claimed.
    atomic_write_bytes: int = 0


@dataclass(frozen=True)
class VmSpec:
    request_id: str
    name: str
    vcpus: int
    memory_mib: int
    image: str
    hugepage_size_kb: int = 2048
    profile: str = ""
    node: int | None = None  # the scheduler's choice; None = first that fits
    disks: tuple[DiskSpec, ...] = ()
    vfs: tuple[VfReq, ...] = ()
    guest_numa: bool = False  # one guest NUMA cell for a one-node VM (a spanning VM always has cells)
    emulator_policy: str = "host"  # "host" | "share" | "isolate" (hostd/carve/vmclaim.py)
    cpus: tuple[int, ...] = ()  # the scheduler's CPU choice (Placement.cpus); a preference
    labels: dict[str, str] = field(default_factory=dict)
    cells: tuple[CellReq, ...] = ()  # spanning host nodes: one guest NUMA cell each (Placement.cells)

    def request(self) -> VmRequest:
        """The resource part, for the claim."""
        return VmRequest(self.request_id, self.name, self.vcpus, self.memory_mib,
                         self.hugepage_size_kb, self.node,
                         tuple(DiskReq(d.disk, d.iotune.bytes_sec, d.iotune.iops, d.atomic_write_bytes)
                               for d in self.disks),
                         self.vfs, self.emulator_policy, self.cpus, self.cells)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (ledger, domain metadata). A disk's ``atomic_write_bytes`` is left out
        when 0, so specs without the ask read as they did before it existed (golden
        domain XML, older hostds reading a migration peer's metadata)."""
        d = to_jsonable(self)
        for disk in d["disks"]:
            if not disk.get("atomic_write_bytes"):
                disk.pop("atomic_write_bytes", None)
        for vf in d["vfs"]:  # likewise a VF's migration mode when it is the default
            if vf.get("migration") == VfMigration.NONE:
                vf.pop("migration", None)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VmSpec":
        return from_jsonable(cls, d, "spec")

    def same_as(self, other: "VmSpec") -> bool:
        return json.dumps(self.to_dict(), sort_keys=True) == json.dumps(other.to_dict(), sort_keys=True)


def spec_problem(spec: VmSpec) -> NoFit | None:
    """The request's fields against their bounds (``api.bounds``; the table is in
    hostd/README.md): the one check of what a caller sent, made before anything is
    looked up, claimed or written. Whether the host can have the VM is the claim's
    question (``vmclaim.claim``)."""
    checks: list[tuple[str, Callable[[], object]]] = [
        ("request_id", lambda: bounds.check_request_id(spec.request_id)),
        ("name", lambda: bounds.check_vm_name(spec.name)),
        ("image", lambda: bounds.check_image(spec.image)),
        ("profile", lambda: bounds.check_profile(spec.profile)),
        ("labels", lambda: bounds.check_labels(spec.labels)),
        ("vcpus", lambda: bounds.check_range(spec.vcpus, 1, bounds.VCPUS_MAX)),
        ("memory_mib", lambda: bounds.check_range(spec.memory_mib, 1, bounds.MEMORY_MIB_MAX)),
        ("disks", lambda: bounds.check_count(len(spec.disks), bounds.DISKS_MAX, "disks")),
        ("vfs", lambda: bounds.check_count(len(spec.vfs), bounds.VFS_MAX, "VFs")),
        ("placement.numa_node", lambda: spec.node is None or bounds.check_numa_node(spec.node)),
        ("placement.cpus", lambda: _cpus(spec.cpus)),
        ("placement.cells", lambda: bounds.check_count(len(spec.cells), bounds.MAX_NUMA_NODES, "cells")),
    ]
    for i, d in enumerate(spec.disks):
        checks.append((f"disks[{i}].disk", lambda d=d: bounds.check_disk_ref(d.disk)))
        checks.append((f"disks[{i}].atomic_write_bytes",
                       lambda d=d: bounds.check_atomic_write_bytes(d.atomic_write_bytes)))
    for i, v in enumerate(spec.vfs):
        checks.append((f"vfs[{i}].pf", lambda v=v: bounds.check_pf(v.pf)))
        checks.append((f"vfs[{i}].migration", lambda v=v: bounds.check_vf_migration(v.migration)))
    for i, c in enumerate(spec.cells):
        checks.append((f"placement.cells[{i}].numa_node", lambda c=c: bounds.check_numa_node(c.node)))
        checks.append((f"placement.cells[{i}].cpus", lambda c=c: _cpus(c.prefer_cpus)))
        checks.append((f"placement.cells[{i}].memory_mib",
                       lambda c=c: bounds.check_range(c.memory_mib, 1, bounds.MEMORY_MIB_MAX)))
    for field_, check in checks:
        try:
            check()
        except ValueError as e:
            return NoFit(field_, str(e))
    for i, d in enumerate(spec.disks):
        bad = d.iotune.check(f"disks[{i}].iotune")
        if bad:
            return NoFit(*bad)
    # the request's own shape (a page multiple, emulator_policy, a VF's MAC, VLAN and
    # rates, the cells): the caller's to fix on any host, so refused here as invalid, not
    # by the claim as "cannot be honoured here" (the claim checks it again: it is pure)
    return validate_request(spec.request())


def _cpus(cpus: tuple[int, ...]) -> None:
    bounds.check_count(len(cpus), bounds.MAX_CPUS, "CPUs")
    for c in cpus:
        bounds.check_cpu_id(c)
