"""VM request/response bodies (the REST contract; api/openapi.json snapshots them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from api.states import MigrationPhase, MigrationResult, MigrationState, OnMaintenance, VfMigration, VmStatus

NAME = r"^[A-Za-z0-9_.-]{1,48}$"
LABEL_KEY = r"^[A-Za-z0-9_./-]{1,63}$"


class IoTuneIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    total_bytes_sec: StrictInt = Field(0, ge=0, le=2**63 - 1)
    read_bytes_sec: StrictInt = Field(0, ge=0, le=2**63 - 1)
    write_bytes_sec: StrictInt = Field(0, ge=0, le=2**63 - 1)
    total_iops_sec: StrictInt = Field(0, ge=0, le=2**63 - 1)
    read_iops_sec: StrictInt = Field(0, ge=0, le=2**63 - 1)
    write_iops_sec: StrictInt = Field(0, ge=0, le=2**63 - 1)
    total_bytes_sec_max: StrictInt = Field(0, ge=0, le=2**63 - 1)
    total_iops_sec_max: StrictInt = Field(0, ge=0, le=2**63 - 1)
    total_bytes_sec_max_length: StrictInt = Field(0, ge=0, le=2**32 - 1)
    total_iops_sec_max_length: StrictInt = Field(0, ge=0, le=2**32 - 1)
    group_name: str = Field("", pattern=r"^[A-Za-z0-9_.-]{0,64}$")

    def bytes_sec(self) -> int:
        """What the throttle lets through at most (counts against the disk's budget)."""
        return self.total_bytes_sec or (self.read_bytes_sec + self.write_bytes_sec)

    def iops(self) -> int:
        return self.total_iops_sec or (self.read_iops_sec + self.write_iops_sec)


class DiskIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    disk: str = Field("", max_length=128, description="kernel name or stable id; empty = any of `class`")
    cls: str = Field("", alias="class", max_length=32, description="disk class: nvme, ssd, hdd, ...")
    min_size_bytes: StrictInt = Field(0, ge=0, le=2**63 - 1)
    iotune: IoTuneIn = Field(default_factory=IoTuneIn)
    atomic_write_bytes: StrictInt = Field(
        0, ge=0, le=2**31, description="the guest must be able to write this many bytes whole, "
        "across a power failure (a power of two, 512 B to 1 MiB; api/bounds.py); 0 = no need. "
        "Only disks whose unit covers it, on a path that carries it to the guest, fit.")


class VfIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pf: str = Field("", max_length=32, description="PF netdev; empty = any node-local PF")
    mac: str = Field("", pattern=r"^(|([0-9a-f]{2}:){5}[0-9a-f]{2})$")
    vlan: StrictInt = Field(0, ge=0, le=4094)
    max_tx_rate_mbps: StrictInt = Field(0, ge=0, le=10**6)
    min_tx_rate_mbps: StrictInt = Field(0, ge=0, le=10**6)
    migration: VfMigration = Field(
        VfMigration.NONE, description="how the VF takes a live move (a passed-through function cannot be "
        "migrated): failover = created with QEMU's virtio-net failover pair (a virtio-net standby on the "
        "host's failover bridge, the VF its primary, one MAC; the guest needs the net_failover driver) and "
        "keeps its network on the standby while the VF is unplugged; interrupt = the VM accepts losing the "
        "VF for the move (unplugged on the source, the target plugs its own); none = a live move is refused")


class AntiAffinity(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group: str = Field(pattern=NAME)
    scope: Literal["host", "rack"] = "host"


class DisruptionBudget(BaseModel):
    """VMs that serve together (like Kubernetes' PodDisruptionBudget): a drain makes at
    most ``max_unavailable`` of the group's VMs unavailable at once, counting every VM
    of the group in the fleet that is not running or is being moved. VMs of one group
    should give one number; when they differ, the smallest holds."""

    model_config = ConfigDict(extra="forbid")
    group: str = Field(pattern=NAME)
    max_unavailable: StrictInt = Field(1, ge=0, le=10000, description="0: a drain never moves or stops them")


class VmCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME)
    vcpus: StrictInt = Field(ge=1, le=1024)
    memory_mib: StrictInt = Field(ge=2, le=2**32)
    page_size_kb: Literal[2048, 1048576] = 2048
    image: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    profile: str = Field("", max_length=64)
    disks: list[DiskIn] = Field(default_factory=list, max_length=32)
    vfs: list[VfIn] = Field(default_factory=list, max_length=16)
    allow_span_nodes: StrictBool = False
    guest_numa: StrictBool = False
    anti_affinity: AntiAffinity | None = None
    policy: Literal["pack", "spread"] | None = None
    host_labels: dict[str, str] = Field(default_factory=dict, max_length=16)
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    tenant: str | None = Field(None, pattern=NAME, description="admin only; tenants create as themselves")
    on_maintenance: OnMaintenance | None = Field(
        None, description="what a drain of its host may do (like GCE's onHostMaintenance): `replace` creates "
                          "it again from this request on another host and deletes this one once the new one "
                          "runs; `stop` shuts it down (status `stopped`, its resources freed); `migrate` moves "
                          "it live to another host (same boot, memory and disk contents; its raw disks copied); "
                          "`block` waits for its owner to move or delete it. Not given: the fleet's default "
                          "(the scheduler's `drain.on_maintenance`, `block` unless configured), recorded in "
                          "the stored request")
    disruption_budget: DisruptionBudget | None = None


class PagesOut(BaseModel):
    node: int
    size_kb: int
    count: int


class VfOut(BaseModel):
    pf: str
    index: int
    max_tx_rate_mbps: int
    min_tx_rate_mbps: int


class DiskOut(BaseModel):
    name: str
    bytes_sec: int
    iops: int


class CellOut(BaseModel):
    """One guest NUMA cell: its vCPUs' host CPUs and its memory, all on host node ``node``."""

    node: int
    cpus: list[int]
    memory_mib: int


class PlacementOut(BaseModel):
    nodes: list[int]
    cpus: list[int]
    hugepages: list[PagesOut]
    vfs: list[VfOut]
    disks: list[DiskOut]
    cells: list[CellOut] = Field(description="guest NUMA cells in order: one per host node the VM uses")


class MigrationProgressOut(BaseModel):
    """The source hostd's last sample of the move's job (GetMigration), as the scheduler
    driving the move took it (every `migration.progress_s` while the job runs): served
    from the VM's record, `age_s` old; no hostd is asked per read."""

    sampled_at: float
    age_s: float = Field(description="seconds since the sample was taken")
    active: bool = Field(description="the job ran at the sample; false: it has ended, the figures are its last")
    elapsed_ms: int = Field(description="the job's time so far (libvirt's time elapsed)")
    memory_remaining_bytes: int
    disk_remaining_bytes: int = Field(description="raw-disk bytes still to copy (the NBD mirror)")
    memory_bps: int = Field(description="the memory stream's rate, bytes/s")
    expected_downtime_ms: int = Field(description="the guest's pause at the switch-over if it came now")


class MigrationOut(BaseModel):
    """A live move under way: the VM runs on ``host`` until it runs on the target."""

    target_host: str
    state: MigrationState = Field(description="preparing: the target is claimed and being prepared; migrating: "
                                              "the source is moving it")
    since: float = Field(description="when the move's state was last written, or its lease renewed")
    started: float = Field(description="when the move was asked (0: asked before this scheduler kept it)")
    phase: MigrationPhase = Field(description="what it does now: preparing, starting (the source's job not "
                                              "sampled yet), disks (copying raw disks), memory, settling (the "
                                              "job is over: completed on the target or undone)")
    progress: MigrationProgressOut | None = Field(description="the source's last sample; null before the first")


class LastMigrationOut(BaseModel):
    """How the VM's last live move ended."""

    from_host: str
    to_host: str
    result: MigrationResult = Field(description="done: it runs on `to_host`; failed: undone, it runs on "
                                                "`from_host` (`reason` says why)")
    reason: str
    started: float = Field(description="when it was asked (0: not known)")
    finished: float
    total_s: float | None = Field(description="asked to settled, seconds (null: start not known)")
    job_ms: int = Field(description="libvirt's job time (a failed move: its last sample's)")
    downtime_ms: int = Field(description="the guest's pause at the switch-over, as libvirt measured it "
                                         "(0 when it did not switch over)")
    data_bytes: int = Field(description="memory and disk bytes the job sent")


class MigrateRequest(BaseModel):
    """`POST /v1/vms/{id}/migrate`: move a running VM live to another host."""

    model_config = ConfigDict(extra="forbid")
    target_host: str | None = Field(None, min_length=1, max_length=64,
                                    description="the host to move it to (active, up, and the VM fits); "
                                                "not given: placement picks, with the VM's own request")


class VmPublic(BaseModel):
    id: str
    name: str
    tenant: str
    status: VmStatus
    reason: str
    host: str | None
    replaces: str | None = Field(None, description="the VM this one replaces (a drain's `replace`), until that one is deleted")
    placement: PlacementOut | None
    hostd_vm_id: str
    attempts: int
    request: VmCreate
    migration: MigrationOut | None = Field(None, description="a live move under way (`POST /v1/vms/{id}/migrate`, "
                                                             "a drain's `migrate`)")
    last_migration: LastMigrationOut | None = Field(None, description="how its last live move ended: time, "
                                                                     "downtime, result")
    created: float
    updated: float


class VmsPublic(BaseModel):
    items: list[VmPublic]
    next: str | None = None


class IoLimitsUpdate(BaseModel):
    """At least one disk or VF to change: the schema says so (``anyOf``); the service
    refuses an empty one (422 naming ``disks``)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [
        {"required": ["disks"], "properties": {"disks": {"minItems": 1}}},
        {"required": ["vfs"], "properties": {"vfs": {"minItems": 1}}}]})
    disks: list[DiskIoUpdate] = Field(default_factory=list, max_length=32)
    vfs: list[VfRateUpdate] = Field(default_factory=list, max_length=32)


class VfRateUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    vf: StrictInt = Field(ge=0, le=63, description="the VF's position in the VM's placement.vfs")
    max_tx_rate_mbps: StrictInt = Field(ge=0, le=10**6, description="0 = no cap")
    min_tx_rate_mbps: StrictInt = Field(0, ge=0, le=10**6, description="a guarantee, reserved from the PF's tx budget")


class DiskIoUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    disk: str = Field(min_length=1, max_length=128)
    iotune: IoTuneIn


class CandidateOut(BaseModel):
    host: str
    placement: PlacementOut


class RejectionOut(BaseModel):
    host: str
    resource: str
    reason: str


class PreviewPublic(BaseModel):
    fits: bool
    host: str | None
    placement: PlacementOut | None
    candidates: list[CandidateOut]
    rejections: dict[str, int] = Field(description="hosts rejected, counted per short resource")
    rejected_hosts: list[RejectionOut] = Field(description="first 100 rejections with their reason")
    examined: int


IoLimitsUpdate.model_rebuild()
