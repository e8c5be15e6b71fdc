"""The audit trail's reads (newest first, a tenant's own records only) and the record of
a refused call, each in a transaction of its own."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from scheduler.db.engine import Store
from scheduler.repo import audit as audit_repo
from scheduler.schemas.audit import AuditOut, AuditPublic


class AuditService:
    def __init__(self, *, store: Store, clock: Callable[[], float] = time.time):
        self.store, self.clock = store, clock

    def list(self, *, tenant: str | None, since: float | None = None, until: float | None = None,
             principal: str | None = None, action: str | None = None, target: str | None = None,
             before: int | None = None, limit: int = 100) -> AuditPublic:
        """``limit`` records older than id ``before``; ``tenant``: only that tenant's (None:
        all). ``next`` is the ``before`` of the next page, None on the last."""
        with self.store.read() as s:
            rows = audit_repo.list_audit(session=s, limit=limit + 1, before_id=before, since=since, until=until,
                                         principal=principal, action=action, target=target, tenant=tenant)
            items = [AuditOut(id=a.id, at=a.at, principal=a.principal, action=a.action, target=a.target,
                              detail=a.detail or {}) for a in rows]
        more = len(items) > limit
        items = items[:limit]
        return AuditPublic(items=items, next=str(items[-1].id) if more else None)

    def denied(self, *, principal: str, target: str, detail: dict[str, Any]) -> None:
        """``auth.denied``: a call refused its authorisation (403)."""
        with self.store.write() as s:
            audit_repo.record(session=s, principal=principal, action="auth.denied", target=target, now=self.clock(),
                              detail=detail)
