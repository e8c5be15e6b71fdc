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


class HostAdminOwned(SchedulerError):
    """A host another owner cordoned or drained: only that owner may change its admin
    state, unless the request says ``force`` (two operators, or an operator and a fleet
    rollout, must not undo each other's cordons unknowingly)."""

    code = "hyb.host.admin_owned"
    status = 409


class HostAdminStale(SchedulerError):
    """A forced admin change whose ``expect_owner`` no longer holds the host: the hold
    it meant to override changed since the caller read it (the error names who holds
    it now, and since when)."""

    code = "hyb.host.admin_stale"
    status = 409


class BeatTooSoon(SchedulerError):
    """A host beat again sooner than ``placement.heartbeat_min_interval_s`` after its last
    beat: one host's flood must not take the event loop from the fleet."""

    code = "hyb.heartbeat.too_soon"
    status = 429


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


class MigrationUnderWay(SchedulerError):
    """The VM is moving live already (``extra``: its target and where the move stands)."""

    code = "hyb.vm.migrating"
    status = 409


class NotMovable(SchedulerError):
    """The VM may not move live now, or not to the host named (the field says which)."""

    code = "hyb.migration.refused"
    status = 409


class NoValidHost(SchedulerError):
    """Nowhere fits; ``extra["rejections"]`` counts the short resource per host."""

    code = "hyb.placement.no_valid_host"
    status = 507


class HostdFailed(SchedulerError):
    code = "hyb.dispatch.failed"
    status = 502


class StoreUnavailable(SchedulerError):
    """The database failed under the request (a full disk, a lost connection, a lock not
    granted within the busy timeout): the request's transaction is rolled back, and the
    same request may succeed once the cause is gone, so it is the service that is
    unavailable (503), not the request that is wrong."""

    code = "hyb.store.unavailable"
    status = 503


class RolloutNotFound(SchedulerError):
    code = "hyb.rollout.not_found"
    status = 404


class RolloutHostNotFound(SchedulerError):
    code = "hyb.rollout.host_not_found"
    status = 404


class RolloutExists(SchedulerError):
    code = "hyb.rollout.exists"
    status = 409


class RolloutOverlap(SchedulerError):
    """The new (or reactivated) rollout shares hosts with another active rollout: a host
    belongs to at most one, so two controllers never drive the same host."""

    code = "hyb.rollout.overlap"
    status = 409


class RolloutLeaseHeld(SchedulerError):
    """Another controller holds the rollout's lease, and it has not lapsed."""

    code = "hyb.rollout.lease_held"
    status = 409


class RolloutLeaseLost(SchedulerError):
    """The writer's fence is the lease's current one, but the lease lapsed or was
    released: nobody may write under it until a controller takes the lease again."""

    code = "hyb.rollout.lease_lost"
    status = 409


class RolloutStaleFence(SchedulerError):
    """A controller's write with a fence older than the rollout's lease: another
    controller has taken the lease since (the error names who, and when). Fences are
    handed out by the scheduler, one more with every take, and only grow."""

    code = "hyb.rollout.stale_fence"
    status = 409


class RolloutNotYours(Forbidden):
    """A write with the rollout's current fence from a principal other than the one that
    took the lease: only the lease's principal may act as the rollout."""

    code = "hyb.rollout.not_yours"


class RolloutStaleState(SchedulerError):
    """The host, or the rollout, was not in the state the writer expected (another
    writer moved it: the error names who, and when)."""

    code = "hyb.rollout.stale_state"
    status = 409


class RolloutBadState(SchedulerError):
    """An operator's verb that does not apply to the rollout's current state."""

    code = "hyb.rollout.bad_state"
    status = 409
