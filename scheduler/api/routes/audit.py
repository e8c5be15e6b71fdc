"""/v1/audit: who did what, newest first. An admin sees everything; a tenant sees the
records of its own VMs and of its own principals (refused calls included); a host
principal sees nothing here."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from scheduler.api.deps import CurrentPrincipal, tenant_scope
from scheduler.api.errors import ERRORS
from scheduler.repo import audit as audit_repo
from scheduler.schemas.audit import AuditOut, AuditPublic

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
    tenant = tenant_scope(p)  # admin: None (everything); others: their tenant, or 403

    def read() -> list[AuditOut]:
        with request.app.state.store.read() as s:
            rows = audit_repo.list_audit(session=s, limit=limit + 1, before_id=before, since=since, until=until,
                                      principal=principal, action=action, target=target, tenant=tenant)
            return [AuditOut(id=a.id, at=a.at, principal=a.principal, action=a.action, target=a.target,
                             detail=a.detail or {}) for a in rows]
    items = await run_in_threadpool(read)
    more = len(items) > limit
    items = items[:limit]
    return AuditPublic(items=items, next=str(items[-1].id) if more else None)
