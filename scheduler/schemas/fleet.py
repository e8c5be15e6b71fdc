"""The fleet's history (``POST /v1/hosts/{name}/days``) and its utilisation view
(``GET /v1/fleet/utilization``)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from api.states import HostClass, HostState

Percent = Annotated[StrictInt, Field(ge=0, le=100)]


class PeakIn(BaseModel):
    """Mean CPUs in use over the host-local peak window, by class."""

    model_config = ConfigDict(extra="forbid")
    start: str = Field(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$", description="host-local HH:MM")
    end: str = Field(pattern=r"^([01][0-9]|2[0-4]):[0-5][0-9]$", description="host-local HH:MM, after start")
    samples: StrictInt = Field(ge=0, le=86400)
    io: float = Field(ge=0, le=65536, description="the IO service")
    vms: float = Field(ge=0, le=65536)
    other: float = Field(ge=0, le=65536)


class HostDayIn(BaseModel):
    """One host-local day of a host, folded by its hostd from its samples: what the
    fleet view needs, under 256 bytes stored. Sent again as the day goes on (the latest
    replaces the earlier) and once more after the peak window and the day end."""

    model_config = ConfigDict(extra="forbid")
    day: dt.date
    utc_offset_min: StrictInt = Field(ge=-720, le=840)
    cpus: StrictInt = Field(ge=1, le=65536, description="online CPUs")
    samples: StrictInt = Field(ge=0, le=86400)
    peak: PeakIn
    hours: list[Percent | None] = Field(min_length=24, max_length=24,
                                        description="per host-local hour: mean CPU use of the whole host, percent")
    hist: list[StrictInt] = Field(min_length=20, max_length=20,
                                  description="the day's samples of whole-host CPU use in 5 % bins")
    probe_p99_ms_max: float | None = Field(None, ge=0)
    psi_some_avg10_max: float | None = Field(None, ge=0, le=100)
    foreign_cpu_s: float = Field(0.0, ge=0)
    probe_failed: StrictInt = Field(0, ge=0)

    @field_validator("hist")
    @classmethod
    def _counts(cls, v: list[int]) -> list[int]:
        if any(n < 0 or n > 86400 for n in v):
            raise ValueError("each count is 0..86400 samples")
        return v


class HostDaysIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    days: list[HostDayIn] = Field(min_length=1, max_length=3, description="today's so far, and yesterday's last")


class DaysAccepted(BaseModel):
    days: int = Field(description="summaries taken (written with the next heartbeat flush)")


class UtilizationBin(BaseModel):
    lo: float
    hi: float
    counts: dict[str, int] = Field(description="hosts per group in this bin")
    hosts: str = Field(description="the request that lists this bin's hosts")


class GroupSummary(BaseModel):
    hosts: int
    mean: float | None
    median: float | None
    p90: float | None


class DayDistribution(BaseModel):
    day: dt.date
    hosts_included: int
    hosts_missing: int = Field(description="registered hosts with no data for the day and window")
    bins: list[UtilizationBin]
    groups: dict[str, GroupSummary]


class UtilizationPublic(BaseModel):
    """The share of each host's CPUs in use, binned across the fleet."""

    window: str = Field(description='"peak" (the window each hostd folds, by class) or host-local hours "HH-HH"')
    group: str
    bins: int
    day: DayDistribution
    compare: DayDistribution | None = None


class HeatmapDay(BaseModel):
    day: dt.date
    counts: list[int] = Field(description="hosts per bin, bins equal over 0..1 of the share of CPUs in use")
    hosts: int = Field(description="hosts with a value for the day and window")


class HeatmapPublic(BaseModel):
    """Hosts per bin of CPU use, for each of a run of days (the console's heatmap): the
    whole-host share as ``GET /v1/fleet/utilization`` bins it, all groups together."""

    window: str
    bins: int
    days: list[HeatmapDay] = Field(description="oldest first, ending with the asked day")


class BinHost(BaseModel):
    host: str
    value: float


class BinHostsPublic(BaseModel):
    day: dt.date
    bin: int
    lo: float
    hi: float
    hosts: list[BinHost]


class IoHealthLimits(BaseModel):
    model_config = ConfigDict(frozen=True)
    probe_p99_ms: float = Field(description="the IO service's probe p99, worst 5 minutes of the day")
    psi_some_avg10: float = Field(description="CPU pressure (some, avg10) on the IO CPUs, worst of the day, percent")
    foreign_cpu_s: float = Field(description="CPU seconds other threads ran on the IO CPUs over the day")
    probe_failed: int = Field(description="failed probes over the day")


class IoHealthHost(BaseModel):
    host: str
    rack: str
    over: list[str] = Field(description="the limits this host's day is over")
    probe_p99_ms_max: float | None
    psi_some_avg10_max: float | None
    foreign_cpu_s: float
    probe_failed: int


class IoHealthPublic(BaseModel):
    """Hosts whose IO-health figures for a day are over the limits (the day summaries
    hostd sends; the live signal is in Prometheus)."""
    day: dt.date
    limits: IoHealthLimits
    hosts_checked: int = Field(description="hosts with a summary for the day")
    hosts_missing: int
    hosts_over: list[IoHealthHost]


class PagesOut(BaseModel):
    size_kb: int
    free: int = Field(description="on hosts that take VMs (up, admin state active)")
    total: int = Field(description="on hosts that take VMs")


class FleetHostsPublic(BaseModel):
    """The fleet's hosts counted, and its free capacity, computed by the scheduler in one
    read (what the console's fleet page shows; `GET /v1/hosts` gives them one by one)."""
    hosts: int
    states: dict[str, int] = Field(description="by state: " + ", ".join(HostState))
    classes: dict[str, int] = Field(description="by what an operator asks first: " + ", ".join(HostClass)
                                    + " (its active rollout failed it); a host in an active rollout that "
                                    "is not pending, verified, skipped or rolled back is converting")
    cpus_free: int = Field(description="dedicated VM CPUs free on hosts that take VMs")
    cpus_total: int = Field(description="dedicated VM CPUs on every host")
    pages: list[PagesOut]
    vfs_free: int
    vfs_total: int = Field(description="on every host")
    tx_free_mbps: int = Field(description="PF tx bandwidth not reserved by VFs' min rates, hosts that take VMs")
    disks_free: int
    disks_total: int = Field(description="on every host")
    disk_iops_free: int = Field(description="the IOPS budgets of the free disks")
