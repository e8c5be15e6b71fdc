"""The carve plan: what the policy makes of a topology (pure data).

The contract between hostd (which plans and applies it) and the scheduler (which
places VMs on it): ``hostd.carve.plan.plan_host(topology, policy)`` makes one, its JSON
form (``Layout.to_json()``) is what `hostd plan --json` prints, `hostd carve` applies
and hostd registers with the scheduler; documented in ``api/layout.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from api.jsonmodel import from_jsonable, to_jsonable


@dataclass(frozen=True)
class HugepageTarget:
    size_kb: int
    count: int  # pages the pool must hold on this node for VMs

    @property
    def memory_kb(self) -> int:
        return self.size_kb * self.count


@dataclass(frozen=True)
class NodeLayout:
    node: int
    io_cpus: tuple[int, ...]
    host_cpus: tuple[int, ...]
    vm_cpus: tuple[int, ...]
    hugepages: tuple[HugepageTarget, ...]  # one per size the policy asks for on this node


@dataclass(frozen=True)
class VfSlot:
    index: int  # VF index on the PF (virtfnN)
    max_tx_rate_mbps: int  # default cap applied at carve time (0 = none)
    min_tx_rate_mbps: int


@dataclass(frozen=True)
class PfLayout:
    name: str
    pci: str
    node: int | None
    numvfs: int  # sriov_numvfs to set
    bandwidth_mbps: int  # tx budget VMs may reserve across all VFs
    slots: tuple[VfSlot, ...]


@dataclass(frozen=True)
class DiskBudget:
    name: str
    id: str | None
    node: int | None
    size_bytes: int
    bytes_sec: int  # IO budget VMs may consume in total, 0 = unlimited
    iops: int


@dataclass(frozen=True)
class BootChange:
    """A change that only takes effect after a reboot (kernel cmdline)."""

    param: str  # "isolcpus", "nohz_full", "hugepagesz=1G hugepages"
    value: str
    why: str


@dataclass(frozen=True)
class IoServiceTarget:
    kind: str  # "unit" | "cgroup" | "process" | "none"
    name: str  # unit name, cgroup path, or process match


@dataclass(frozen=True)
class Layout:
    nodes: tuple[NodeLayout, ...]
    pfs: tuple[PfLayout, ...]
    disks: tuple[DiskBudget, ...]
    io_service: IoServiceTarget
    vm_cgroup: str
    reboot_required: tuple[BootChange, ...]
    warnings: tuple[str, ...] = ()

    @property
    def io_cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for n in self.nodes for c in n.io_cpus))

    @property
    def host_cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for n in self.nodes for c in n.host_cpus))

    @property
    def vm_cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for n in self.nodes for c in n.vm_cpus))

    def to_dict(self) -> dict[str, Any]:
        d = to_jsonable(self)
        # Flat views for readers who do not care about nodes.
        d["io_cpus"] = list(self.io_cpus)
        d["host_cpus"] = list(self.host_cpus)
        d["vm_cpus"] = {str(n.node): list(n.vm_cpus) for n in self.nodes}
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Layout":
        core = {k: v for k, v in data.items() if k not in ("io_cpus", "host_cpus", "vm_cpus")}
        return from_jsonable(cls, core, "layout")

    @classmethod
    def from_json(cls, text: str) -> "Layout":
        return cls.from_dict(json.loads(text))
