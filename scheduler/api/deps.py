"""Request dependencies: the principal from the bearer token, scope checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from scheduler.service.tokens import TokenBook
from scheduler.errors import Forbidden, Unauthenticated


@dataclass(frozen=True)
class Principal:
    name: str
    scopes: frozenset[str]

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes

    @property
    def tenant(self) -> str | None:
        return next((s.split(":", 1)[1] for s in sorted(self.scopes) if s.startswith("tenant:")), None)

    @property
    def host(self) -> str | None:
        """The one host a ``host:<name>`` token may act as; None for other principals."""
        return next((s.split(":", 1)[1] for s in sorted(self.scopes) if s.startswith("host:")), None)

    def require(self, *any_of: str) -> None:
        """Any of the scopes, or admin. ``host:<name>`` counts as ``host``."""
        if self.admin or any(s in self.scopes for s in any_of) or ("host" in any_of and self.host):
            return
        raise Forbidden(f"{self.name} lacks scope {' or '.join(any_of) or 'admin'}")


async def principal(request: Request) -> Principal:
    """Async on purpose: a sync dependency runs in the thread pool, one hop per request."""
    return principal_of(request)


def principal_of(request: Request) -> Principal:
    """The principal the gate found (api/gate.py), or from the header when a test app
    skips the gate."""
    p = request.scope.get("state", {}).get("principal")
    if p is not None:
        return p
    return principal_for(request.headers.get("authorization", ""), request.app.state.tokens)


def principal_for(auth: str, book: TokenBook) -> Principal:
    """The principal of an ``Authorization`` header's value (config or database token)."""
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("send Authorization: Bearer <token>", field="Authorization")
    e = book.lookup(token)
    return Principal(e.name, e.scopes)


CurrentPrincipal = Annotated[Principal, Depends(principal)]


def tenant_scope(p: Principal) -> str | None:
    """None = sees every tenant (admin); else the tenant the principal is limited to."""
    if p.admin:
        return None
    if p.tenant is None:
        raise Forbidden(f"{p.name} has no tenant scope")
    return p.tenant
