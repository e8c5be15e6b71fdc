"""Audit trail bodies."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class AuditOut(BaseModel):
    id: int
    at: float
    principal: str
    action: str  # "vm.create", "host.register.denied", "auth.denied", ...
    target: str  # a VM id, a host name, or the request path of a refused call
    detail: dict[str, Any]


class AuditPublic(BaseModel):
    items: list[AuditOut]
    next: str | None = None  # pass as ``before`` for the next (older) page
