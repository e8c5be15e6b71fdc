"""Request dependencies: the principal from the bearer token. What it may do is
``scheduler/policies.py``'s."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from scheduler.errors import Unauthenticated
from scheduler.policies import Principal
from scheduler.service.tokens import TokenBook


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
    return book.lookup(token).principal


CurrentPrincipal = Annotated[Principal, Depends(principal)]
