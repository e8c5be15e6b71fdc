"""Carve policy: the operator's intent for one host, read from TOML.

Every key is documented in ``hostd/carve/policy.example.toml``. Validation errors
name the field (``io_service.cpus_per_node: must be >= 0``) and nothing is applied.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from api.bounds import check_policy_data, check_policy_text
from hostd.cpulist import CpuListError, parse_cpu_list

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG])i?B?\s*$", re.IGNORECASE)
_UNITS_KB = {"K": 1, "M": 1024, "G": 1024 * 1024}


class PolicyError(ValueError):
    """The policy is invalid; ``field`` names the offending key."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def parse_page_size_kb(text: str | int) -> int:
    """"2M" / "2MiB" / "1G" / 2048 (kB) -> size in kB."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a page size like '2M' or '1G'")
    return int(m.group(1)) * _UNITS_KB[m.group(2).upper()]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CpuReservation(_Strict):
    """CPUs set aside: a count per NUMA node, or an explicit CPU list (not both)."""

    cpus_per_node: Annotated[int, Field(ge=0)] | None = None
    cpus: str | None = None  # kernel cpulist syntax, e.g. "0,24"
    whole_cores: bool = True  # take SMT siblings together

    @field_validator("cpus")
    @classmethod
    def _cpulist(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_cpu_list(v)
            except CpuListError as e:
                raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _one_of(self) -> "CpuReservation":
        if self.cpus_per_node is not None and self.cpus is not None:
            raise ValueError("give either cpus_per_node or cpus, not both")
        return self

    def cpu_set(self) -> frozenset[int] | None:
        return parse_cpu_list(self.cpus) if self.cpus is not None else None


class IoService(CpuReservation):
    """The resident IO service and its reserved CPUs. Name it by exactly one of
    a systemd unit, a cgroup path, or a process match (for hosts without systemd)."""

    unit: str | None = None
    cgroup: str | None = None
    process: str | None = None  # matched against the full command line, like pgrep -f
    # At carve, also take io_cpus from every other task, IRQ and the unbound workqueues,
    # live (hostd/apply/exclusive.py); uncarve gives everything back as it was.
    exclusive: bool = True

    @model_validator(mode="after")
    def _one_target(self) -> "IoService":
        given = [k for k in ("unit", "cgroup", "process") if getattr(self, k)]
        if len(given) > 1:
            raise ValueError(f"name the IO service once; got {', '.join(given)}")
        return self


class VmSlice(_Strict):
    cgroup: str = "machine"  # cgroup (relative to the cpuset root) that holds the VMs
    allow_split_cores: bool = False  # let a core's siblings go to IO service and VMs


class HugepagePoolPolicy(_Strict):
    size: str  # "2M" or "1G"
    count_per_node: Annotated[int, Field(ge=0)] | None = None
    percent: Annotated[float, Field(gt=0, le=100)] | None = None  # of each node's memory
    nodes: tuple[int, ...] | None = None  # default: every node

    @field_validator("size")
    @classmethod
    def _size(cls, v: str) -> str:
        parse_page_size_kb(v)
        return v

    @model_validator(mode="after")
    def _one_of(self) -> "HugepagePoolPolicy":
        if (self.count_per_node is None) == (self.percent is None):
            raise ValueError("give exactly one of count_per_node or percent")
        return self

    @property
    def size_kb(self) -> int:
        return parse_page_size_kb(self.size)


class Hugepages(_Strict):
    pools: tuple[HugepagePoolPolicy, ...] = ()
    # Memory per node that stays outside hugepage pools, for the IO service's
    # page cache and the host. A plan that would go below it is a NoFit.
    io_floor_percent: Annotated[float, Field(ge=0, le=100)] = 20.0


class PfPolicy(_Strict):
    name: str  # PF netdev name, e.g. "ens1f0"
    vfs: Annotated[int, Field(ge=0)]
    max_tx_rate_mbps: Annotated[int, Field(ge=0)] = 0  # default per-VF cap, 0 = none
    min_tx_rate_mbps: Annotated[int, Field(ge=0)] = 0  # default per-VF guarantee
    bandwidth_mbps: Annotated[int, Field(gt=0)] | None = None  # budget; default link speed


class Sriov(_Strict):
    pfs: tuple[PfPolicy, ...] = ()


class DiskBudgetPolicy(_Strict):
    bytes_sec: Annotated[int, Field(ge=0)]
    iops: Annotated[int, Field(ge=0)]


class AtomicPaths(_Strict):
    # Paths that could carry a disk's atomic-write unit to a guest (hostd/carve/atomic.py).
    # A QEMU whose emulated NVMe has the atomic.* properties (9.2+, e.g. from
    # bookworm-backports), named in the domain's <emulator>: its path. The carve then
    # lists the path, and refuses it for atomic writes with the reason (it can split them).
    nvme_emulator: str = ""
    # NVMe functions passed through with VFIO: not built by hostd yet; refused when set.
    vfio_nvme: bool = False

    @field_validator("vfio_nvme")
    @classmethod
    def _no_vfio_yet(cls, v: bool) -> bool:
        if v:
            raise ValueError("hostd cannot pass NVMe functions through with VFIO yet "
                             "(raw disks go to guests as virtio-blk)")
        return v

    @field_validator("nvme_emulator")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if v and (not v.startswith("/") or len(v) > 4096 or any(c in v for c in "\0\n")):
            raise ValueError("must be an absolute path to a QEMU binary")
        return v


class Disks(_Strict):
    # Disk allow-list: kernel names, stable ids, or /dev paths; fnmatch globs allowed.
    allow: tuple[str, ...] = ()
    # Disks (same patterns) that may go to a VM although they carry a filesystem,
    # RAID, LVM or partition-table signature: the operator says their data may go.
    wipe_ok: tuple[str, ...] = ()
    default_bytes_sec: Annotated[int, Field(ge=0)] = 0  # 0 = unlimited budget
    default_iops: Annotated[int, Field(ge=0)] = 0
    budget: dict[str, DiskBudgetPolicy] = {}  # per disk (name or id)
    atomic: AtomicPaths = AtomicPaths()


class Policy(_Strict):
    io_service: IoService = IoService()
    host: CpuReservation = CpuReservation()
    vm: VmSlice = VmSlice()
    hugepages: Hugepages = Hugepages()
    sriov: Sriov = Sriov()
    disks: Disks = Disks()


def policy_from_dict(data: dict) -> Policy:
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-after"))
        raise PolicyError(loc or "policy", err["msg"].removeprefix("Value error, ")) from None


def loads_policy(text: str, *, source: str = "policy") -> Policy:
    """A policy from its TOML text (a rollout ships it in a request); ``source`` names
    the text in a TOML syntax error. The text's size and nesting are bounded
    (``api.bounds``) before it is parsed."""
    try:
        check_policy_text(text)
    except ValueError as e:
        raise PolicyError(source, str(e)) from None
    try:
        data = check_policy_data(tomllib.loads(text))
    except tomllib.TOMLDecodeError as e:
        raise PolicyError(source, f"not valid TOML: {e}") from None
    except (ValueError, RecursionError) as e:  # an integer of 5,000 digits; nesting the pre-check missed
        raise PolicyError(source, f"not a policy: {str(e)[:200]}") from None
    return policy_from_dict(data)


def load_policy(path: Path) -> Policy:
    try:
        text = path.read_text()
    except OSError as e:
        raise PolicyError(str(path), e.strerror or str(e)) from None
    return loads_policy(text, source=str(path))

