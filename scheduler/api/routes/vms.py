"""/v1/vms: create (Idempotency-Key, dry_run preview), get, list, delete, IO limits, start, live move."""

from __future__ import annotations

import time
from typing import Annotated

import orjson
from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask

from api.states import VmStatus
from scheduler import policies
from scheduler.api.deps import CurrentPrincipal, principal_of
from scheduler.api.errors import ERRORS, OVERLOADED, ErrorBody
from scheduler.api.wire import KEY, CreateRequest, created_headers, read_create, vm_json
from scheduler.schemas.vms import IoLimitsUpdate, MigrateRequest, PreviewPublic, VmPublic, VmsPublic
from scheduler.service.vms import VmService, vm_public

router = APIRouter(prefix="/v1/vms", tags=["vms"], responses=ERRORS)


def _svc(request: Request) -> VmService:
    return request.app.state.vms


# The create route reads its own inputs (``create_vm``): FastAPI's generic parameter
# solving takes a quarter of the event loop's time per create (py-spy, one replica at
# 400/s), and the event loop is what saturates first. The contract is the same and
# is declared here for the OpenAPI document (the snapshot test keeps it unchanged).
_CREATE_INPUTS = {
    "parameters": [
        {"in": "query", "name": "dry_run", "required": False,
         "schema": {"default": False, "title": "Dry Run", "type": "boolean"}},
        {"in": "header", "name": "idempotency-key", "required": True,
         "description": "a retry with the same key returns the same VM; a dry run takes one too (not recorded)",
         "schema": {"pattern": KEY, "type": "string", "title": "Idempotency-Key"}},
    ],
    "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/VmCreate"}}},
                    "required": True},
}


class _OrjsonResponse(JSONResponse):
    """The create answer encoded by orjson (``json.dumps`` was 4 % of the event loop)."""

    def render(self, content: object) -> bytes:
        return orjson.dumps(content)


async def create_inputs(request: Request) -> CreateRequest:
    """What FastAPI would have solved for the create route, read by the one reader of
    this request (``api/wire.py``), which the fast path uses too."""
    h = request.headers
    return read_create(principal_of(request), dry_run=request.query_params.get("dry_run"),
                            key=h.get("idempotency-key"), ctype=h.get("content-type", ""),
                            body=await request.body())


@router.post("", status_code=202, response_model=VmPublic | PreviewPublic, openapi_extra=_CREATE_INPUTS,
             responses={200: {"description": "a replay of the same Idempotency-Key, or the dry-run preview"},
                        507: {"model": ErrorBody, "description": "no host fits; rejections counted"},
                        **OVERLOADED})
async def create_vm(request: Request) -> Response:
    """Claim resources on the best host and dispatch to its hostd in the background
    (`pending` -> `creating` -> `running` | `failed`). `dry_run=true`: where it would go
    and why the other hosts were rejected, counted per short resource; nothing claimed."""
    req = await create_inputs(request)
    svc = _svc(request)
    if req.dry_run:
        preview = await run_in_threadpool(svc.preview, req.body)
        return JSONResponse(preview.model_dump(mode="json"), status_code=200)
    t = time.perf_counter()
    vm, replay = await svc.create_async(req.body, tenant=req.tenant, key=req.key, actor=req.actor)
    dispatch = vm.status == VmStatus.PENDING and request.app.state.dispatch_enabled
    return _OrjsonResponse(vm_json(vm), status_code=200 if replay else 202,
                           headers=created_headers(vm, time.perf_counter() - t),
                           background=BackgroundTask(svc.dispatch, vm.id) if dispatch else None)


@router.get("", response_model=VmsPublic)
def list_vms(request: Request, p: CurrentPrincipal, host: str | None = None,
             status: VmStatus | None = None,
             name: str | None = None, tenant: str | None = None,
             limit: Annotated[int, Query(ge=1, le=1000)] = 100, after: str = "") -> VmsPublic:
    """Tenants see only their own VMs; `after` + `next` page through by id."""
    return _svc(request).list(scope=policies.vm_tenant(p), tenant=tenant, host=host, status=status, name=name,
                              limit=limit, after=after)


@router.get("/{vm_id}", response_model=VmPublic)
def get_vm(vm_id: str, request: Request, p: CurrentPrincipal) -> VmPublic:
    return _svc(request).get(vm_id, scope=policies.vm_tenant(p))


@router.delete("/{vm_id}", status_code=204, response_class=Response)
def delete_vm(vm_id: str, request: Request, p: CurrentPrincipal) -> Response:
    _svc(request).delete(vm_id, tenant=policies.vm_tenant(p), actor=p.name)
    return Response(status_code=204)


@router.patch("/{vm_id}/io-limits", response_model=VmPublic)
def update_io_limits(vm_id: str, body: IoLimitsUpdate, request: Request, p: CurrentPrincipal) -> VmPublic:
    """Live change of disk throttles (within each disk's IO budget) and VF tx rates (a
    higher min rate is reserved from the PF's tx budget first; hostd applies both)."""
    vm = _svc(request).update_io(vm_id, [(d.disk, d.iotune) for d in body.disks], tenant=policies.vm_tenant(p),
                                 vfs=[(v.vf, v.max_tx_rate_mbps, v.min_tx_rate_mbps) for v in body.vfs],
                                 actor=p.name)
    return vm_public(vm)


@router.post("/{vm_id}/start", status_code=202, response_model=VmPublic,
             responses={200: {"description": "pending, creating or running already: the VM as it is, "
                                             "nothing done"},
                        409: {"model": ErrorBody, "description": "`hyb.vm.busy`: the VM failed or is being "
                                                                 "deleted (the message says which); only a "
                                                                 "stopped VM starts"},
                        507: {"model": ErrorBody, "description": "no host fits its request now; it stays "
                                                                 "stopped, nothing claimed"}})
def start_vm(vm_id: str, request: Request, p: CurrentPrincipal) -> Response:
    """Start a stopped VM again (a drain stops the VMs with `on_maintenance = "stop"`):
    placed from its own request on a host that fits it now, as a new VM is, and created
    there by that host's hostd in the background (`pending` -> `creating` -> `running` |
    `failed`). The VM keeps its id, name and Idempotency-Key; its guest boots afresh (a
    stop keeps no memory). Tenants start their own VMs."""
    svc = _svc(request)
    vm, started = svc.start(vm_id, tenant=policies.vm_tenant(p), actor=p.name)
    dispatch = started and request.app.state.dispatch_enabled
    return JSONResponse(vm_public(vm).model_dump(mode="json"), status_code=202 if started else 200,
                        background=BackgroundTask(svc.dispatch, vm.id) if dispatch else None)


@router.post("/{vm_id}/migrate", status_code=202, response_model=VmPublic,
             responses={200: {"description": "this VM is moving already (to the host asked, or none was named): "
                                             "that move, not a second one"},
                        409: {"model": ErrorBody, "description": "`hyb.vm.migrating`: moving to another host "
                                                                 "already (named in the error); "
                                                                 "`hyb.migration.refused`: it may not move now, or "
                                                                 "not to `target_host` (the field says why)"},
                        507: {"model": ErrorBody, "description": "no host fits (no `target_host` named)"}})
def migrate_vm(vm_id: str, request: Request, p: CurrentPrincipal, body: MigrateRequest | None = None) -> Response:
    """Move a running VM live to another host (same boot, memory and raw disks copied):
    to `target_host` (it must exist, be up and active and fit the VM), or where placement
    puts the VM's own request (anti-affinity, the VM not counted against itself). Its
    disruption group's budget must allow one more unavailable VM. The target is claimed
    now and the move runs in the background: `migration` on the VM says where it stands;
    the VM runs on `host` until it runs on the target, and a move that fails leaves it
    there with the failure in its `reason`."""
    policies.move_vm(p)
    svc = request.app.state.migrations
    vm, started = svc.ask(vm_id, target=body.target_host if body else None, actor=p.name)
    return JSONResponse(vm_public(vm, svc.clock()).model_dump(mode="json"), status_code=202 if started else 200)
