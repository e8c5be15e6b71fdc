"""What a caller asks hostd to run: the VM spec (the gRPC CreateVMRequest as data).

The spec is stored verbatim in the ledger and in the domain's metadata, so a VM
can be re-checked, re-rendered or adopted after a restart from either copy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from api.jsonmodel import from_jsonable, to_jsonable
from hostd.carve.vmclaim import CellReq, DiskReq, VfReq, VmRequest


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
        """(field, reason) when libvirt would refuse this combination."""
        if self.total_bytes_sec and (self.read_bytes_sec or self.write_bytes_sec):
            return f"{where}.total_bytes_sec", "cannot be combined with read_/write_bytes_sec"
        if self.total_iops_sec and (self.read_iops_sec or self.write_iops_sec):
            return f"{where}.total_iops_sec", "cannot be combined with read_/write_iops_sec"
        if self.total_bytes_sec_max and self.total_bytes_sec_max < self.total_bytes_sec:
            return f"{where}.total_bytes_sec_max", "is below total_bytes_sec"
        if self.total_iops_sec_max and self.total_iops_sec_max < self.total_iops_sec:
            return f"{where}.total_iops_sec_max", "is below total_iops_sec"
        if self.total_bytes_sec_max_length and not self.total_bytes_sec_max:
            return f"{where}.total_bytes_sec_max_length", "needs total_bytes_sec_max"
        if self.total_iops_sec_max_length and not self.total_iops_sec_max:
            return f"{where}.total_iops_sec_max_length", "needs total_iops_sec_max"
        return None

    def libvirt_params(self) -> dict[str, int | str]:
        """For virDomainSetBlockIoTune: base rates always (0 clears one, so switching
        from total_* to read_/write_* works); bursts only when set, because libvirt
        checks a base rate against a burst of 0 as if it were a limit."""
        d: dict[str, int | str] = {k: v for k, v in to_jsonable(self).items()
                                   if k != "group_name" and (v or "_max" not in k)}
        if self.group_name:
            d["group_name"] = self.group_name
        return d


@dataclass(frozen=True)
class DiskSpec:
    disk: str  # kernel name or stable id of an assignable disk
    iotune: IoTune = IoTune()


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
                         tuple(DiskReq(d.disk, d.iotune.bytes_sec, d.iotune.iops) for d in self.disks),
                         self.vfs, self.emulator_policy, self.cpus, self.cells)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VmSpec":
        return from_jsonable(cls, d, "spec")

    def same_as(self, other: "VmSpec") -> bool:
        return json.dumps(self.to_dict(), sort_keys=True) == json.dumps(other.to_dict(), sort_keys=True)
