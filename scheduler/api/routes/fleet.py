"""/v1/fleet: the fleet's utilisation over the host-day history (admin)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from scheduler import policies
from scheduler.api.deps import CurrentPrincipal
from scheduler.api.errors import ERRORS
from scheduler.schemas.fleet import (BinHostsPublic, FleetHostsPublic, HeatmapPublic, IoHealthLimits, IoHealthPublic,
                                     UtilizationPublic)
from scheduler.service.fleet import ALERT_LIMITS

router = APIRouter(prefix="/v1/fleet", tags=["fleet"], responses=ERRORS)


@router.get("/utilization", response_model=UtilizationPublic, openapi_extra={"x-examples": {
    "evening peak by class": "/v1/fleet/utilization?day=2026-11-25&group=class",
    "before/after a conversion, by rack": "/v1/fleet/utilization?day=2026-11-25&compare=2026-10-25&group=rack",
    "20:00-23:00 host-local, by carved policy": "/v1/fleet/utilization?day=2026-11-25&window=20-23&group=policy"}})
def utilization(request: Request, p: CurrentPrincipal, day: dt.date, compare: dt.date | None = None,
                window: str = "peak", group: Literal["class", "rack", "state", "policy"] = "class",
                bins: Annotated[int, Query()] = 20) -> UtilizationPublic:
    """The distribution of host CPU use across the fleet on a host-local `day`: the share
    of each host's CPUs in use, in `bins` equal bins over 0..1, with the host count per
    group in each bin, and each group's mean, median and p90. `window`: `peak` (the
    window each hostd folds, 21:00-22:00 by default; `group=class` splits the IO
    service, the VMs and the rest) or host-local hours `HH-HH` (whole-host use). Hosts
    registered but without data for the day are counted as missing. `compare`: a second
    day, answered alike (before/after). Each bin names the request that lists its hosts."""
    policies.read_fleet(p)
    return request.app.state.fleet.utilization(day=day, compare=compare, window=window, group=group, bins=bins)


@router.get("/utilization/heatmap", response_model=HeatmapPublic, openapi_extra={"x-examples": {
    "the last 28 days' evening peaks": "/v1/fleet/utilization/heatmap?day=2026-11-25&days=28",
    "a week of 09:00-18:00 host-local": "/v1/fleet/utilization/heatmap?day=2026-11-25&days=7&window=9-18"}})
def utilization_heatmap(request: Request, p: CurrentPrincipal, day: dt.date, days: int = 28, window: str = "peak",
                        bins: int = 20) -> HeatmapPublic:
    """Hosts per bin of CPU use for each of `days` days ending with the host-local `day`
    (oldest first): for every day what `GET /v1/fleet/utilization` counts per bin, all
    groups together, in one query over the history. `window` as there."""
    policies.read_fleet(p)
    return request.app.state.fleet.heatmap(day=day, days=days, window=window, bins=bins)


@router.get("/utilization/hosts", response_model=BinHostsPublic)
def utilization_hosts(request: Request, p: CurrentPrincipal, day: dt.date, bin: int, window: str = "peak",
                      bins: int = 20, cls: Annotated[str, Query(alias="class")] = "all") -> BinHostsPublic:
    """The hosts in one bin of `GET /v1/fleet/utilization` with their value (`class`:
    `all`, or `io`, `vms`, `other` with `window=peak`)."""
    policies.read_fleet(p)
    return request.app.state.fleet.bin_hosts(day=day, window=window, bins=bins, index=bin, cls=cls)


@router.get("/io-health", response_model=IoHealthPublic, openapi_extra={"x-examples": {
    "the alert rules' limits": "/v1/fleet/io-health?day=2026-11-25",
    "a stricter probe": "/v1/fleet/io-health?day=2026-11-25&probe_p99_ms=10"}})
def io_health(request: Request, p: CurrentPrincipal, day: dt.date,
              probe_p99_ms: Annotated[float, Query(ge=0)] = ALERT_LIMITS.probe_p99_ms,
              psi_some_avg10: Annotated[float, Query(ge=0, le=100)] = ALERT_LIMITS.psi_some_avg10,
              foreign_cpu_s: Annotated[float, Query(ge=0)] = ALERT_LIMITS.foreign_cpu_s,
              probe_failed: Annotated[int, Query(ge=0)] = ALERT_LIMITS.probe_failed) -> IoHealthPublic:
    """The hosts whose IO-health figures for a host-local `day` are over a limit: the
    IO service's probe p99 (ms, the worst 5 minutes), CPU pressure on its CPUs (PSI
    some avg10, percent, the worst), CPU seconds other threads ran there over the day,
    failed probes. The defaults are the alert rules' (deploy/prometheus/io-health.rules.yml:
    probe p99 over 50 ms, PSI over 10 %; foreign CPU over a minute a day; any failed
    probe)."""
    policies.read_fleet(p)
    return request.app.state.fleet.io_health(day=day, limits=IoHealthLimits(
        probe_p99_ms=probe_p99_ms, psi_some_avg10=psi_some_avg10, foreign_cpu_s=foreign_cpu_s,
        probe_failed=probe_failed))


@router.get("/hosts", response_model=FleetHostsPublic)
def hosts_summary(request: Request, p: CurrentPrincipal) -> FleetHostsPublic:
    """The hosts counted by state and by class (unconverted, converting, carved,
    cordoned, down, failed: the hosts of active rollouts by their step there), and the
    free capacity on the hosts that take VMs, against every host's: one read, where
    counting from `GET /v1/hosts` costs a full host view each (scope `host`)."""
    policies.read_hosts(p)
    return request.app.state.hosts.summary()
