"""/v1/vms: create (Idempotency-Key, dry_run preview), get, list, delete, IO limits."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.background import BackgroundTask

from scheduler.api.deps import CurrentPrincipal, Principal, principal_of, tenant_scope
from scheduler.api.errors import ERRORS, ErrorBody
from scheduler.db.models import Vm
from scheduler.errors import Forbidden, InvalidRequest
from scheduler.fit import FitResult
from scheduler.resources import Allocation, split_cells
from scheduler.schemas.vms import (CandidateOut, IoLimitsUpdate, PlacementOut, PreviewPublic, RejectionOut,
                                   VmCreate, VmPublic, VmsPublic)
from scheduler.service.vms import VmService

router = APIRouter(prefix="/v1/vms", tags=["vms"], responses=ERRORS)
KEY = r"^[A-Za-z0-9_.:-]{1,128}$"


def _svc(request: Request) -> VmService:
    return request.app.state.vms


def placement_out(a: Allocation) -> PlacementOut:
    return PlacementOut(nodes=list(a.nodes), cpus=list(a.cpus),
                        hugepages=[{"node": n, "size_kb": s, "count": c} for n, s, c in a.pages],
                        vfs=[v.__dict__ for v in a.vfs], disks=[d.__dict__ for d in a.disks],
                        cells=cells_json(a.nodes, a.cpus, a.pages, a.cell_vcpus))


def cells_json(nodes: Sequence[int], cpus: Sequence[int], pages: Sequence[Sequence[int]],
               cell_vcpus: Sequence[int]) -> list[dict]:
    """The guest NUMA cells of an allocation (its fields, or its stored dict's), as JSON."""
    size = pages[0][1] if pages else 0  # one page size per VM
    return [{"node": node, "cpus": list(c), "memory_mib": n * size // 1024}
            for node, c, n in split_cells(nodes, cpus, pages, cell_vcpus)]


def vm_json(vm: Vm) -> dict:
    """``vm_out(vm)`` as JSON, built directly: the create path's response (re-validating
    the stored request through the models cost as much as the claim). A test keeps the
    two equal."""
    a = vm.allocation
    placement = None if not a else {
        "nodes": list(a["nodes"]), "cpus": list(a["cpus"]),
        "hugepages": [{"node": n, "size_kb": s, "count": c} for n, s, c in a["pages"]],
        "vfs": [dict(v) for v in a.get("vfs", ())], "disks": [dict(d) for d in a.get("disks", ())],
        "cells": cells_json(a["nodes"], a["cpus"], a["pages"], a.get("cell_vcpus", ()))}
    return {"id": vm.id, "name": vm.name, "tenant": vm.tenant, "status": vm.status, "reason": vm.reason,
            "host": vm.host, "placement": placement, "hostd_vm_id": vm.hostd_vm_id, "attempts": vm.attempts,
            # as vm_out: the stored request carries the effective tenant, the public one None
            "request": {k: (None if k == "tenant" else v) for k, v in vm.request.items()},
            "created": vm.created, "updated": vm.updated}


def vm_out(vm: Vm) -> VmPublic:
    req = {k: v for k, v in vm.request.items() if k != "tenant"}
    return VmPublic(id=vm.id, name=vm.name, tenant=vm.tenant, status=vm.status, reason=vm.reason, host=vm.host,
                    placement=placement_out(Allocation.from_dict(vm.allocation)) if vm.allocation else None,
                    hostd_vm_id=vm.hostd_vm_id, attempts=vm.attempts, request=VmCreate.model_validate(req),
                    created=vm.created, updated=vm.updated)


def preview_out(res: FitResult) -> PreviewPublic:
    best = res.candidates[0] if res.candidates else None
    return PreviewPublic(
        fits=best is not None, host=best.host if best else None,
        placement=placement_out(best.alloc) if best else None,
        candidates=[CandidateOut(host=c.host, placement=placement_out(c.alloc)) for c in res.candidates],
        rejections=res.counts, examined=res.examined,
        rejected_hosts=[RejectionOut(host=r.host, resource=r.resource, reason=r.reason)
                        for r in sorted(res.rejections, key=lambda r: r.host)[:100]])


# The create route reads its own inputs (``create_vm``): FastAPI's generic parameter
# solving was a quarter of the event loop's time per create (py-spy, one replica at
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
KEY_RE = re.compile(KEY)
_BOOL = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


class _OrjsonResponse(JSONResponse):
    """The create answer encoded by orjson (``json.dumps`` was 4 % of the event loop)."""

    def render(self, content: object) -> bytes:
        return orjson.dumps(content)


def json_content(ctype: str) -> bool:
    """A body sent as JSON, or with no Content-Type at all."""
    return not ctype or ctype.split(";", 1)[0].strip().lower().endswith(("/json", "+json"))


def owner(scope: str | None, body: VmCreate) -> str | None:
    """The tenant a new VM belongs to, for a principal limited to tenant ``scope`` (None:
    an admin, who may name any tenant in the body); None when the body names another
    tenant than the principal's (403)."""
    if scope is not None and body.tenant not in (None, scope):
        return None
    return scope or body.tenant or "default"


def created_headers(vm: Vm, claim_s: float) -> dict[str, str]:
    """The create answer's headers: the claim's time (fit + transaction, the bench reads
    it) and where the VM lives."""
    return {"Server-Timing": f"claim;dur={claim_s * 1e3:.3f}", "Location": f"/v1/vms/{vm.id}"}


def _invalid(loc: tuple, msg: str) -> RequestValidationError:
    return RequestValidationError([{"loc": loc, "msg": msg, "type": "value_error"}])


async def create_inputs(request: Request) -> tuple[Principal, VmCreate, str | None, bool]:
    """What FastAPI would have solved for the create route, in its order (the principal
    first, then query, header and body), with the same errors."""
    p = principal_of(request)
    raw = request.query_params.get("dry_run")
    dry_run = False if raw is None else _BOOL.get(raw.lower())
    if dry_run is None:
        raise _invalid(("query", "dry_run"), "Input should be a valid boolean, unable to interpret input")
    key = request.headers.get("idempotency-key")
    if key is not None and not KEY_RE.match(key):
        raise _invalid(("header", "Idempotency-Key"), f"String should match pattern '{KEY}'")
    ctype = request.headers.get("content-type", "")
    if not json_content(ctype):
        raise _invalid(("body",), f"send the VM as JSON (Content-Type: application/json), not {ctype}")
    try:
        body = VmCreate.model_validate_json(await request.body())
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None
    return p, body, key, dry_run


@router.post("", status_code=202, response_model=VmPublic | PreviewPublic, openapi_extra=_CREATE_INPUTS,
             responses={200: {"description": "a replay of the same Idempotency-Key, or the dry-run preview"},
                        507: {"model": ErrorBody, "description": "no host fits; rejections counted"}})
async def create_vm(request: Request) -> Response:
    """Claim resources on the best host and dispatch to its hostd in the background
    (`pending` -> `creating` -> `running` | `failed`). `dry_run=true`: where it would go
    and why the other hosts were rejected, counted per short resource; nothing claimed."""
    p, body, idempotency_key, dry_run = await create_inputs(request)
    tenant = tenant_scope(p)
    vm_tenant = owner(tenant, body)
    if vm_tenant is None:
        raise Forbidden(f"{p.name} may only create VMs for tenant {tenant}", field="tenant")
    svc = _svc(request)
    if not idempotency_key:
        raise InvalidRequest("required: a retry with the same key returns the same VM", field="Idempotency-Key")
    if dry_run:
        preview = preview_out(await run_in_threadpool(svc.preview, body))
        return JSONResponse(preview.model_dump(mode="json"), status_code=200)
    t = time.perf_counter()
    vm, replay = await svc.create_async(body, tenant=vm_tenant, key=idempotency_key, actor=p.name)
    dispatch = vm.status == "pending" and request.app.state.dispatch_enabled
    return _OrjsonResponse(vm_json(vm), status_code=200 if replay else 202,
                           headers=created_headers(vm, time.perf_counter() - t),
                           background=BackgroundTask(svc.dispatch, vm.id) if dispatch else None)


@router.get("", response_model=VmsPublic)
def list_vms(request: Request, p: CurrentPrincipal, host: str | None = None,
             status: Literal["pending", "creating", "running", "failed", "deleting"] | None = None,
             name: str | None = None, tenant: str | None = None,
             limit: Annotated[int, Query(ge=1, le=1000)] = 100, after: str = "") -> VmsPublic:
    """Tenants see only their own VMs; `after` + `next` page through by id."""
    mine = tenant_scope(p)
    if mine is not None:
        tenant = mine
    with request.app.state.store.read() as s:
        from scheduler.repo.vms import list_vms as q
        rows = q(session=s, tenant=tenant, host=host, status=status, name=name, limit=limit, after=after)
        items = [vm_out(v) for v in rows]
    return VmsPublic(items=items, next=items[-1].id if len(items) == limit else None)


@router.get("/{vm_id}", response_model=VmPublic)
def get_vm(vm_id: str, request: Request, p: CurrentPrincipal) -> VmPublic:
    with request.app.state.store.read() as s:
        from scheduler.repo.vms import get_vm as q
        return vm_out(q(session=s, vm_id=vm_id, tenant=tenant_scope(p)))


@router.delete("/{vm_id}", status_code=204, response_class=Response)
def delete_vm(vm_id: str, request: Request, p: CurrentPrincipal) -> Response:
    _svc(request).delete(vm_id, tenant=tenant_scope(p), actor=p.name)
    return Response(status_code=204)


@router.patch("/{vm_id}/io-limits", response_model=VmPublic)
def update_io_limits(vm_id: str, body: IoLimitsUpdate, request: Request, p: CurrentPrincipal) -> VmPublic:
    """Live change of disk throttles (within each disk's IO budget) and VF tx rates (a
    higher min rate is reserved from the PF's tx budget first; hostd applies both)."""
    vm = _svc(request).update_io(vm_id, [(d.disk, d.iotune) for d in body.disks], tenant=tenant_scope(p),
                                 vfs=[(v.vf, v.max_tx_rate_mbps, v.min_tx_rate_mbps) for v in body.vfs],
                                 actor=p.name)
    return vm_out(vm)
