"""/v1/audit: who did what, newest first. An admin sees everything; a tenant sees the
records of its own VMs and of its own principals (refused calls included); a host
principal sees nothing here."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from scheduler import policies
from scheduler.api.deps import CurrentPrincipal
from scheduler.api.errors import ERRORS
from scheduler.schemas.audit import AuditPublic

router = APIRouter(prefix="/v1/audit", tags=["audit"], responses=ERRORS)


@router.get("", response_model=AuditPublic)
async def list_audit(request: Request, p: CurrentPrincipal,
                     since: float | None = Query(None, description="unix time, inclusive"),
                     until: float | None = Query(None, description="unix time, exclusive"),
                     principal: str | None = Query(None, max_length=64),
                     action: str | None = Query(None, max_length=64, description="exact, or a prefix ending in '.'"),
                     target: str | None = Query(None, max_length=128, description="a VM id or host name"),
                     before: int | None = Query(None, ge=1, description="the page after this id (`next`)"),
                     limit: int = Query(100, ge=1, le=1000)) -> AuditPublic:
    tenant = policies.audit_tenant(p)  # admin: None (everything); others: their tenant, or 403
    return await run_in_threadpool(request.app.state.audit.list, tenant=tenant, since=since, until=until,
                                   principal=principal, action=action, target=target, before=before, limit=limit)
