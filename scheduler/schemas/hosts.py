"""Host request/response bodies."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationInfo, field_validator

from api.bounds import HOST_NAME, check_host_labels, check_rack
from api.scrape import check_metrics_url
from api.states import AdminState, DrainAction, HostState
from scheduler.schemas.rollouts import ROLLOUT
from scheduler.schemas.vms import MigrationOut

HOST = rf"^{HOST_NAME}$"
HOSTPORT = r"^[A-Za-z0-9_.:\[\]-]{1,250}:[0-9]{1,5}$"


class HostRegister(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=HOST)
    address: str = Field(pattern=HOSTPORT, description="hostd gRPC endpoint host:port")
    rack: str = Field("", max_length=64)
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    layout: dict[str, Any] = Field(description="the carve layout JSON (api/layout.md)")
    cpu_siblings: dict[str, list[StrictInt]] = Field(default_factory=dict,
                                               description="CPU -> SMT siblings (topology); missing = no SMT")
    pf_min_rate: dict[str, StrictBool] = Field(default_factory=dict,
                                         description="PF -> driver can guarantee min_tx_rate (default true)")
    disk_classes: dict[str, str] = Field(default_factory=dict, description="disk name -> class")
    metrics_url: str | None = Field(
        None, max_length=300, examples=["http://10.1.7.17:9743/metrics"],
        description="hostd's Prometheus endpoint, http(s)://host:port/path; none: not a scrape target "
                    "(GET /v1/prometheus/targets)")
    hostd_version: str | None = Field(None, pattern=r"^[A-Za-z0-9_.+-]{1,64}$")
    carved_policy: str | None = Field(None, pattern=r"^([0-9a-f]{64})?$",
                                      description="sha256 of the carved policy; empty: not carved")

    @field_validator("metrics_url")
    @classmethod
    def _metrics_url(cls, v: str | None) -> str | None:
        return None if v is None else check_metrics_url(v)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        check_host_labels(v)  # api/bounds.py: what hostd checks in its config, so it can register
        return v

    @field_validator("rack")
    @classmethod
    def _rack(cls, v: str) -> str:
        return check_rack(v)


class AdminChange(BaseModel):
    """The optional body of cordon, drain and uncordon. The hold's owner is never sent: it
    is the calling principal, or ``rollout:<name>`` for the controller that holds that
    rollout's lease (``rollout`` with the lease's ``fence``). Only that owner may change
    the admin state again, unless ``force`` with the ``expect_owner`` it overrides."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field("", max_length=256, examples=["replace DIMM B3"],
                        description="shown with the host; left empty by its owner, the current reason stays")
    force: StrictBool = Field(False, description="change it even when another owner holds it (audited with that "
                                                 "owner); needs expect_owner")
    expect_owner: str | None = Field(
        None, max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$", examples=["alice"], validate_default=True,
        description='compare-and-set: refused (409 hyb.host.admin_stale, naming who holds the host and since when) '
                    'unless this owner holds it now, as GET /v1/hosts/{name} shows admin_owner ("": nobody, or a '
                    'hold with no owner recorded); required with force')
    rollout: str | None = Field(None, pattern=ROLLOUT, examples=["convert-r12"],
                                description="act as this rollout's controller: the hold is recorded as "
                                            "rollout:<name>; needs the fence of its lease, taken by the caller")
    fence: StrictInt | None = Field(None, ge=1, validate_default=True,
                                    description="with rollout: the lease's fence (POST /v1/rollouts/{name}/lease)")

    @field_validator("expect_owner")
    @classmethod
    def _forced_from_whom(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None and info.data.get("force"):
            raise ValueError("force needs expect_owner: the owner whose hold it overrides (GET /v1/hosts/{name})")
        return v

    @field_validator("fence")
    @classmethod
    def _fence_with_rollout(cls, v: int | None, info: ValidationInfo) -> int | None:
        if (v is None) != (info.data.get("rollout") is None):
            raise ValueError("rollout and fence go together: a rollout's hold needs the fence of its lease")
        return v


class PoolOut(BaseModel):
    size_kb: int
    total: int
    used: int
    free: int


class NodeOut(BaseModel):
    node: int
    io_cpus: list[int] = Field(default_factory=list, description="the layout's CPUs of the resident IO service on "
                               "this node (never handed to a VM)")
    host_cpus: list[int] = Field(default_factory=list, description="the layout's CPUs of the host OS, hostd and "
                                 "shared emulator threads on this node")
    vm_cpus: list[int]
    used_cpus: list[int]
    free_cpus: int
    hugepages: list[PoolOut]


class PfOut(BaseModel):
    name: str
    node: int | None
    vfs_total: int
    vfs_used: int
    bandwidth_mbps: int
    reserved_mbps: int
    min_tx_rate_supported: bool


class HostDiskOut(BaseModel):
    name: str
    id: str
    node: int | None
    cls: str = Field(serialization_alias="class")
    size_bytes: int
    bytes_sec: int
    iops: int
    used: bool
    atomic_write_bytes: int = Field(0, description="atomic-write unit a VM is guaranteed on this disk "
                                                    "(0 = not offered as atomic)")
    atomic_note: str = Field("", description="hostd's reason for the atomic unit offered, or why none")


class HostPublic(BaseModel):
    name: str
    address: str
    rack: str
    labels: dict[str, str]
    state: HostState
    admin_state: AdminState
    admin_owner: str | None = Field(None, description='who cordoned or drained it: the principal, or rollout:<name> '
                                                      '("": not recorded); none: active')
    admin_reason: str | None = None
    admin_since: float | None = Field(None, description="unix time the owner took it out of active")
    down_since: float | None = Field(None, description="unix time a liveness check marked it down (silent past "
                                                       "the heartbeat timeout; its running VMs flagged); none: up")
    generation: int
    last_heartbeat: float
    vms: int
    nodes: list[NodeOut]
    pfs: list[PfOut]
    disks: list[HostDiskOut]
    metrics_url: str | None = None
    hostd_version: str | None = None
    carved_policy: str | None = None


class HostsPublic(BaseModel):
    items: list[HostPublic]
    next: str | None = Field(None, description="with `limit`: the name to ask `after` for the next page "
                                               "(absent on the last one)")


class DrainStepOut(BaseModel):
    vm: str
    name: str
    action: DrainAction = Field(
        description="what the drain does to it now, or `wait` (see `why`), or `done`: it holds nothing here")
    why: str
    migration: MigrationOut | None = Field(None, description="moving live: the move and its progress, as on the VM")


class DrainPublic(BaseModel):
    """What a drain of the host does, per VM on it, now (the same plan the drain loop
    acts on); a host not draining shows what a drain would do."""

    host: str
    admin_state: AdminState
    drained: bool = Field(description="draining, and no VM holds anything on it")
    left: int = Field(description="VMs still holding something on the host")
    steps: list[DrainStepOut]


class HostStatsIn(BaseModel):
    """The IO-health signal of the heartbeat interval (hostd/health/summary.py)."""

    model_config = ConfigDict(extra="forbid")
    at: float = Field(ge=0)
    interval_s: float = Field(ge=0, le=86400)
    samples: StrictInt = Field(ge=1, le=86400)
    io_cpu_busy: float = Field(ge=0, le=1)
    io_cpu_busy_max: float = Field(ge=0, le=1)
    cpu_io_service: float = Field(ge=0, le=65536)
    cpu_vms: float = Field(ge=0, le=65536)
    cpu_other: float = Field(ge=0, le=65536)
    foreign_threads_max: StrictInt = Field(ge=0)
    foreign_cpu_s: float = Field(ge=0)
    irqs_per_s: float = Field(ge=0)
    psi_some_avg10_max: float | None = Field(None, ge=0, le=100)
    psi_stall: float | None = Field(None, ge=0)
    throttled_periods: StrictInt = Field(0, ge=0)
    probe_ok: StrictInt = Field(0, ge=0)
    probe_failed: StrictInt = Field(0, ge=0)
    probe_p99_ms_max: float | None = Field(None, ge=0)


class HeartbeatOut(BaseModel):
    """What a heartbeat answers: small, since every host sends one every few seconds
    (the full view is ``GET /v1/hosts/{name}``)."""

    name: str
    state: str  # an AdminState (a host that beats is not down)
    generation: int
    last_heartbeat: float


class HeartbeatIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stats: HostStatsIn | None = None


class StatsBucketOut(BaseModel):
    """One bucket of a host's IO-health history: means over the heartbeats in it, maxima of
    the peaks, sums of the counts."""

    start: float
    heartbeats: int
    samples: int
    io_cpu_busy: float
    io_cpu_busy_max: float
    cpu_io_service: float
    cpu_vms: float
    cpu_other: float
    foreign_threads_max: int
    foreign_cpu_s: float
    irqs_per_s: float
    psi_some_avg10_max: float | None
    psi_stall: float | None
    throttled_periods: int
    probe_ok: int
    probe_failed: int
    probe_p99_ms_max: float | None


class HostStatsPublic(BaseModel):
    host: str
    bucket_s: int
    items: list[StatsBucketOut]


class TargetGroup(BaseModel):
    """One Prometheus http_sd target group: one host's hostd ``/metrics``."""

    targets: list[str] = Field(examples=[["10.1.7.17:9743"]])
    labels: dict[str, str] = Field(examples=[{
        "__scheme__": "http", "__metrics_path__": "/metrics", "host": "oss-17", "rack": "r07",
        "state": "active", "carved_policy": "", "hostd_version": "1.4.0+a1b2c3d4e5f6"}])
