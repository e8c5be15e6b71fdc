"""Domain errors with stable codes (never reused). The API maps them to HTTP status and
``{"error": {"code", "field", "message"}}``; hostd's gRPC statuses carry the same style."""

from __future__ import annotations

from typing import Any


class SchedulerError(Exception):
    code = "hyb.scheduler.error"
    status = 500

    def __init__(self, message: str, *, field: str | None = None, extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.extra = extra or {}

    def __str__(self) -> str:
        where = f" [{self.field}]" if self.field else ""
        return f"{self.code}{where}: {self.message}"


class InvalidRequest(SchedulerError):
    code = "hyb.request.invalid"
    status = 422


class BadLayout(SchedulerError):
    code = "hyb.host.bad_layout"
    status = 422


class Unauthenticated(SchedulerError):
    code = "hyb.auth.missing"
    status = 401


class Forbidden(SchedulerError):
    code = "hyb.auth.forbidden"
    status = 403


class HostNotYours(Forbidden):
    """A host principal acting for a host another principal registered, or outside
    the host its token is bound to (scope ``host:<name>``)."""

    code = "hyb.host.not_yours"


class LayoutShrink(SchedulerError):
    """A re-registration would leave live allocations without their resources."""

    code = "hyb.host.layout_shrink"
    status = 409


class HostNotFound(SchedulerError):
    code = "hyb.host.not_found"
    status = 404


class VmNotFound(SchedulerError):
    code = "hyb.vm.not_found"
    status = 404


class ConcurrentUpdate(SchedulerError):
    """Lost the optimistic-concurrency race more times than the retry bound."""

    code = "hyb.concurrent_update"
    status = 409


class IdempotencyMismatch(SchedulerError):
    code = "hyb.idempotency.mismatch"
    status = 409


class VmBusy(SchedulerError):
    code = "hyb.vm.busy"
    status = 409


class NoValidHost(SchedulerError):
    """Nowhere fits; ``extra["rejections"]`` counts the short resource per host."""

    code = "hyb.placement.no_valid_host"
    status = 507


class HostdFailed(SchedulerError):
    code = "hyb.dispatch.failed"
    status = 502
