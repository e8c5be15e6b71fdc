"""/v1/hosts: registration and heartbeats (scope host), views and admin states (admin)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from api.states import AdminState, HostState
from scheduler import policies
from scheduler.api import wire
from scheduler.api.deps import CurrentPrincipal
from scheduler.api.errors import ERRORS, OVERLOADED
from scheduler.schemas.fleet import DaysAccepted, HostDaysIn
from scheduler.schemas.hosts import (AdminChange, DrainPublic, HeartbeatOut, HostPublic, HostRegister, HostsPublic,
                                     HostStatsPublic)
from scheduler.service.hosts import HostService

router = APIRouter(prefix="/v1/hosts", tags=["hosts"], responses=ERRORS)


def _svc(request: Request) -> HostService:
    return request.app.state.hosts


@router.post("", response_model=HostPublic, status_code=201,
             responses={200: {"model": HostPublic, "description": "re-registered"}, **OVERLOADED})
async def register_host(body: HostRegister, request: Request, response: Response, p: CurrentPrincipal) -> HostPublic:
    policies.act_as_host(p)
    # written with whatever else queued meanwhile, in one transaction (placement.register_batch)
    out, created = await _svc(request).register_async(body, actor=p.name, admin=p.admin, bound_host=p.host)
    if not created:
        response.status_code = 200
    return out


# The heartbeat route reads its own body (``api/wire.py``, as the fast path does, so the
# two cannot disagree on what a heartbeat is); the body it takes is declared here for
# the OpenAPI document, as FastAPI would have (the snapshot test keeps it unchanged).
_BEAT_INPUTS = {"requestBody": {"content": {"application/json": {"schema": {
    "anyOf": [{"$ref": "#/components/schemas/HeartbeatIn"}, {"type": "null"}], "title": "Body"}}}}}


@router.post("/{name}/heartbeat", response_model=HeartbeatOut, openapi_extra=_BEAT_INPUTS, responses=OVERLOADED)
async def heartbeat(name: str, request: Request, p: CurrentPrincipal) -> dict:
    """Alive; with ``stats``, the host's IO-health signal since its last heartbeat (stored,
    downsampled: ``GET /v1/hosts/{name}/stats``)."""
    beat = wire.read_heartbeat(p, ctype=request.headers.get("content-type", ""), body=await request.body())
    return await wire.beat(_svc(request), name, p, beat)


@router.post("/{name}/days", response_model=DaysAccepted, status_code=202)
def host_days(name: str, body: HostDaysIn, request: Request, p: CurrentPrincipal) -> DaysAccepted:
    """The host's day summaries, folded by its hostd (today's so far, and yesterday's
    last): kept for `stats.history_days`, read by `GET /v1/fleet/utilization`. The latest
    of a day replaces the earlier; written with the next heartbeat flush. Who may send
    them is who may beat for the host."""
    policies.act_as_host(p)
    n = _svc(request).record_days(name, body, actor=p.name, admin=p.admin, bound_host=p.host)
    return DaysAccepted(days=n)


@router.get("/{name}/stats", response_model=HostStatsPublic)
def host_stats(name: str, request: Request, p: CurrentPrincipal, since: float | None = None,
               until: float | None = None) -> HostStatsPublic:
    """The host's IO-health history, oldest first, one item per ``stats.bucket_s`` window."""
    policies.read_hosts(p)
    return _svc(request).stats(name, since=since, until=until)


@router.get("", response_model=HostsPublic)
def list_hosts(request: Request, p: CurrentPrincipal, rack: str | None = None,
               state: HostState | None = None,
               limit: Annotated[int | None, Query(ge=1, le=1000)] = None, after: str = "") -> HostsPublic:
    """By name. Without `limit`, every host (about 1.4 kB each); with it, one page, and
    `next` names where the next one starts (`after`), as `/v1/vms` does. `state` filters
    each page, so a page may hold fewer than `limit`: follow `next`, not the count."""
    policies.read_hosts(p)
    return _svc(request).list(rack=rack, state=state, limit=limit, after=after)


@router.get("/{name}", response_model=HostPublic)
def get_host(name: str, request: Request, p: CurrentPrincipal) -> HostPublic:
    policies.read_hosts(p)
    return _svc(request).get(name)


def _state(name: str, state: AdminState, request: Request, p: CurrentPrincipal, body: AdminChange | None) -> HostPublic:
    policies.hold_host(p)
    return _svc(request).set_state(name, state, actor=p.name, change=body or AdminChange())


@router.post("/{name}/cordon", response_model=HostPublic)
def cordon(name: str, request: Request, p: CurrentPrincipal, body: AdminChange | None = None) -> HostPublic:
    """No new VMs; running ones stay. The hold's owner is the caller's principal, or
    `rollout:<name>` for the controller holding that rollout's lease (`rollout`, `fence`).
    409 `hyb.host.admin_owned` when another owner holds the host cordoned or draining
    (`force` with `expect_owner` overrides)."""
    return _state(name, AdminState.CORDONED, request, p, body)


@router.post("/{name}/uncordon", response_model=HostPublic)
def uncordon(name: str, request: Request, p: CurrentPrincipal, body: AdminChange | None = None) -> HostPublic:
    """Active again; ends the hold. 409 `hyb.host.admin_owned` when another owner holds it
    (`force` with `expect_owner` overrides)."""
    return _state(name, AdminState.ACTIVE, request, p, body)


@router.post("/{name}/drain", response_model=HostPublic)
def drain(name: str, request: Request, p: CurrentPrincipal, body: AdminChange | None = None) -> HostPublic:
    """No new VMs, and the VMs on it are moved as each allows (`on_maintenance`: `replace`
    re-creates it elsewhere and deletes it once the new one runs, `stop` shuts it down,
    `block` waits for its owner), within their groups' disruption budgets. The host is
    drained when `vms` reaches 0; `GET /v1/hosts/{name}/drain` says per VM what the drain
    does or waits for. 409 `hyb.host.admin_owned` when another owner holds it (`force`
    with `expect_owner` overrides)."""
    return _state(name, AdminState.DRAINING, request, p, body)


@router.get("/{name}/drain", response_model=DrainPublic)
def drain_status(name: str, request: Request, p: CurrentPrincipal) -> DrainPublic:
    """Per VM on the host: what its drain does now (`replace`, `stop`, `delete_old`),
    or what it waits for (`wait`, with why: its owner, its group's budget, its
    replacement), or `done`."""
    policies.read_hosts(p)
    return request.app.state.drains.status(name)
