"""One place maps errors to HTTP: ``{"error": {"code", "field", "message"}}``."""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from scheduler.errors import Forbidden, SchedulerError, StoreUnavailable

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    code: str
    field: str | None = None
    message: str
    rejections: dict[str, int] | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


ERRORS = {s: {"model": ErrorBody} for s in (401, 403, 404, 409, 422)}
# Load shedding (scheduler/service/shed.py): the requests a replica turns away under overload
OVERLOADED = {503: {"model": ErrorBody, "description": "hyb.scheduler.overloaded: this replica sheds load; "
                    "come back after Retry-After (a heartbeat shed still counts)",
                    "headers": {"Retry-After": {"description": "seconds to wait (hostd adds up to half again)",
                                                "schema": {"type": "integer"}}}}}


def _body(code: str, message: str, field: str | None = None, **extra) -> dict:  # type: ignore[no-untyped-def]
    return {"error": {"code": code, "field": field, "message": message, **extra}}


def domain_body(e: SchedulerError) -> dict:  # type: ignore[type-arg]
    return _body(e.code, e.message, e.field, **({"rejections": e.extra["rejections"]}
                                                 if "rejections" in e.extra else {}))


def retry_after_header(e: SchedulerError) -> list[tuple[str, str]]:
    """``Retry-After`` (whole seconds, rounded up) for an error that says when to retry
    (``extra["retry_after_s"]``: a beat too soon, a request shed for overload)."""
    t = e.extra.get("retry_after_s")
    if t is None:
        return []
    return [("Retry-After", str(max(1, math.ceil(float(t)))))]


def internal_body(e: Exception) -> dict:  # type: ignore[type-arg]
    """A failure of ours: its type, not its text (which may carry internals)."""
    return _body("hyb.scheduler.internal", f"{type(e).__name__}")


def failure(e: Exception) -> tuple[int, dict]:  # type: ignore[type-arg]
    """(status, body) of an exception no domain error describes, logged with it: the
    database's failure (a full disk, a lost connection, a lock not granted within the
    busy timeout) is the store's unavailability, 503 with the driver's first line (its
    cause, such as "database or disk is full"); anything else is ours, 500."""
    log.exception("request failed")
    if isinstance(e, OperationalError):
        cause = str(e.orig).strip() or type(e.orig).__name__
        return 503, domain_body(StoreUnavailable(f"the scheduler's database: {cause.splitlines()[0]}"))
    return 500, internal_body(e)


def field_path(loc: tuple) -> str:
    """('body', 'vfs', 0, 'min_tx_rate_mbps') -> 'vfs[0].min_tx_rate_mbps'."""
    parts = list(loc[1:]) if loc and loc[0] in ("body", "query", "path", "header") else list(loc)
    if loc and loc[0] == "header" and parts:
        return str(parts[0]).title()
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or (str(loc[0]) if loc else "body")


def audit_refusal(req: Request, e: SchedulerError) -> None:
    """A refused authorisation (403), in a transaction of its own: ``auth.denied`` with the
    call and the reason; the tenant's own principal's refusals are the tenant's to see."""
    p = req.scope.get("state", {}).get("principal")
    if p is None:
        return
    detail = {"method": req.method, "reason": e.message, **({"tenant": p.tenant} if p.tenant else {})}
    try:
        req.app.state.audit.denied(principal=p.name, target=req.url.path[:128], detail=detail)
    except Exception:  # noqa: BLE001 - the refusal is answered even if the audit write fails
        log.exception("cannot audit a refused call principal=%s path=%s", p.name, req.url.path)


def install(app: FastAPI) -> None:
    @app.exception_handler(SchedulerError)
    async def _domain(req: Request, e: SchedulerError) -> JSONResponse:
        if e.status == 403 and e.code == Forbidden.code:
            await run_in_threadpool(audit_refusal, req, e)
        return JSONResponse(domain_body(e), status_code=e.status, headers=dict(retry_after_header(e)) or None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        first = errs[0] if errs else {"loc": ("body",), "msg": "invalid"}
        return JSONResponse(_body("hyb.request.invalid", str(first.get("msg")), field_path(tuple(first["loc"]))),
                            status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, e: StarletteHTTPException) -> JSONResponse:
        code = {404: "hyb.http.not_found", 405: "hyb.http.method_not_allowed"}.get(e.status_code, "hyb.http.error")
        return JSONResponse(_body(code, str(e.detail)), status_code=e.status_code,
                            headers=getattr(e, "headers", None))  # 405 carries Allow

    # The database's failure is answered as handled (Starlette's ExceptionMiddleware); any
    # other exception is left to its ServerErrorMiddleware, which answers and re-raises.
    @app.exception_handler(OperationalError)
    @app.exception_handler(Exception)
    async def _crash(_req: Request, e: Exception) -> JSONResponse:
        status, body = failure(e)
        return JSONResponse(body, status_code=status)
