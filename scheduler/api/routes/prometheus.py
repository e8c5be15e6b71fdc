"""/v1/prometheus: where Prometheus finds every hostd's /metrics (scope prometheus, or admin)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from scheduler import policies
from scheduler.api.deps import CurrentPrincipal
from scheduler.api.errors import ERRORS
from scheduler.schemas.hosts import TargetGroup

router = APIRouter(prefix="/v1/prometheus", tags=["prometheus"], responses=ERRORS)


@router.get("/targets", response_model=list[TargetGroup])
def scrape_targets(request: Request, p: CurrentPrincipal) -> list[TargetGroup]:
    """Prometheus HTTP service discovery (`http_sd_configs`): one target group per host
    that registered a metrics address, labelled `host`, `rack`, `state` (active, cordoned,
    draining, down), `carved_policy` (sha256 of the carved policy, empty when not carved)
    and `hostd_version` (each of the last two only when the host's hostd registered it),
    with `__scheme__` and `__metrics_path__` from the address. Hosts registered by a hostd
    that sends no metrics address are not listed. Prometheus authenticates with a bearer
    token of scope `prometheus` (or `admin`); see deploy/prometheus/prometheus.yml."""
    policies.scrape_targets(p)
    return request.app.state.hosts.scrape_targets()
