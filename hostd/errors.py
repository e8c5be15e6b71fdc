"""hostd's failures, all in one place.

Two shapes:

- ``NoFit`` is a *value*: what a pure planner returns when the request cannot be had
  (the carve planner for a policy on a host, the claim check for a VM on a layout).
  It names the field at fault and the reason; it is never ``None``.
- ``HostdError`` and its subclasses are *raised*. Each has a stable code (never
  reused) that the CLI prints and the gRPC layer returns, and names the field or
  object at fault: ``hyb.vm.refused [disks[0].disk]: nvme1n1 cannot be used now``.
  Each class also names the gRPC status it reaches a caller with (``grpc_status``,
  chosen per class, never inherited: tests/hostd/test_errors.py walks every class), so
  a new error cannot fall through a table to INTERNAL. The status is the name of a
  ``grpc.StatusCode`` member (hostd/rpc/servicer.py resolves it): this module sits
  under the pure layers (discover, carve), which have no business importing a
  transport, and the ``GrpcStatus`` literal lets the type checker catch a misspelt
  name as the enum would.

  How the statuses are chosen: INVALID_ARGUMENT for what the caller sent (fix the
  request); FAILED_PRECONDITION for what this host's state refuses (fix the host or
  its config, then retry); ABORTED for an attempt that failed and was undone (a retry
  may succeed once the cause is gone); UNAVAILABLE for a transient state (retry the
  same call later: fleet-rollout pauses on it instead of failing the host); INTERNAL
  only for hostd's own records being unreadable.

Parse errors of the small pure helpers (``CpuListError``, ``PolicyError``,
``ElementError``, ``api.jsonmodel.SchemaError``) stay ``ValueError``s beside their
parsers; the layer that calls them turns them into one of the errors below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

# The grpc.StatusCode members hostd answers with (see the module doc).
GrpcStatus = Literal["INVALID_ARGUMENT", "FAILED_PRECONDITION", "NOT_FOUND", "ALREADY_EXISTS",
                     "PERMISSION_DENIED", "ABORTED", "UNAVAILABLE", "UNIMPLEMENTED", "INTERNAL"]


@dataclass(frozen=True)
class NoFit:
    """The request cannot be honoured here. ``field`` names the key that asked for
    too much (a policy key, a VM request field) or the host part that is missing."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


class HostdError(Exception):
    """The base: never raised itself, and without a status of its own (each subclass
    names one)."""

    code = "hyb.hostd.error"
    grpc_status: ClassVar[GrpcStatus]

    def __init__(self, detail: str, *, field: str | None = None):
        super().__init__(detail)
        self.detail = detail
        self.field = field

    def __str__(self) -> str:
        where = f" [{self.field}]" if self.field else ""
        return f"{self.code}{where}: {self.detail}"


# ---------------------------------------------------------------- daemon and CLI

class ConfigError(HostdError):
    code = "hyb.hostd.bad_config"
    grpc_status = "FAILED_PRECONDITION"


class StartupError(HostdError):
    code = "hyb.hostd.startup"
    grpc_status = "FAILED_PRECONDITION"


class BadPolicy(HostdError):
    code = "hyb.host.bad_policy"
    grpc_status = "FAILED_PRECONDITION"


class BadTopology(HostdError):
    code = "hyb.host.bad_topology"
    grpc_status = "INVALID_ARGUMENT"


class Forbidden(HostdError):
    """The caller's certificate is the fleet CA's, but not one allowed to do this."""

    code = "hyb.rpc.forbidden"
    grpc_status = "PERMISSION_DENIED"


# ---------------------------------------------------------------- the live carve (apply/)

class DeviceBusy(HostdError):
    """A sysfs/cgroupfs write kept answering EBUSY after bounded retries."""

    code = "hyb.host.device_busy"
    grpc_status = "UNAVAILABLE"


class ApplyFailed(HostdError):
    """A carve step failed; every step before it was rolled back."""

    code = "hyb.host.apply_failed"
    grpc_status = "FAILED_PRECONDITION"


class NotCarved(HostdError):
    """The host lacks what the carve makes (a VM's hugetlbfs mount)."""

    code = "hyb.host.not_carved"
    grpc_status = "FAILED_PRECONDITION"


class IoServiceNotFound(HostdError):
    code = "hyb.host.io_service_not_found"
    grpc_status = "FAILED_PRECONDITION"


class BadState(HostdError):
    """A file of hostd's own state (carve journal, carve state, ledger) cannot be read,
    or was written by a newer hostd. Not the caller's doing."""

    code = "hyb.host.bad_state"
    grpc_status = "INTERNAL"


# ---------------------------------------------------------------- VMs

class SpecInvalid(HostdError):
    """The request is malformed (a required field is missing)."""

    code = "hyb.spec.invalid"
    grpc_status = "INVALID_ARGUMENT"


class Refused(HostdError):
    """The request cannot be honoured here; nothing was changed."""

    code = "hyb.vm.refused"
    grpc_status = "FAILED_PRECONDITION"


class NotFound(HostdError):
    code = "hyb.vm.not_found"
    grpc_status = "NOT_FOUND"


class Conflict(HostdError):
    code = "hyb.vm.conflict"
    grpc_status = "ALREADY_EXISTS"


class LedgerConflict(Conflict):
    """The ledger's own keys refused a row (double booking, a reused request id)."""

    grpc_status = "ALREADY_EXISTS"


class CreateFailed(HostdError):
    """CreateVM failed past its checks; every step was rolled back."""

    code = "hyb.vm.create_failed"
    grpc_status = "ABORTED"


class DomainDesignError(HostdError):
    """The VM cannot be turned into a domain as asked; nothing was defined."""

    code = "hyb.vm.bad_domain"
    grpc_status = "FAILED_PRECONDITION"


class BadMetadata(HostdError):
    """hostd's metadata in a domain cannot be read (hostd's own record)."""

    code = "hyb.vm.bad_metadata"
    grpc_status = "INTERNAL"


class LibvirtUnavailable(HostdError):
    code = "hyb.host.libvirt_unavailable"
    grpc_status = "UNAVAILABLE"


class DomainError(HostdError):
    """libvirt failed an operation on a domain (CreateVM rolls back; a retry may succeed
    once the cause, named in the detail, is gone)."""

    code = "hyb.vm.libvirt_error"
    grpc_status = "ABORTED"


# ---------------------------------------------------------------- images and guest profiles

class UnknownImage(HostdError):
    code = "hyb.image.unknown"
    grpc_status = "INVALID_ARGUMENT"


class BadImage(HostdError):
    code = "hyb.image.bad"
    grpc_status = "FAILED_PRECONDITION"


class GuestProfileError(HostdError):
    code = "hyb.guest_profile.bad"
    grpc_status = "FAILED_PRECONDITION"


class UnknownProfile(HostdError):
    code = "hyb.guest_profile.unknown"
    grpc_status = "INVALID_ARGUMENT"


# ---------------------------------------------------------------- remote carve (fleet-rollout's RPCs)

class PolicyInvalid(HostdError):
    """A policy given in a request does not parse or validate (the caller's; a bad
    policy *file* of this host is ``BadPolicy``)."""

    code = "hyb.policy.invalid"
    grpc_status = "INVALID_ARGUMENT"


class DigestMismatch(HostdError):
    """The policy digest the caller planned with is not the digest of the text it sent."""

    code = "hyb.policy.digest_mismatch"
    grpc_status = "INVALID_ARGUMENT"


class CarveNoFit(HostdError):
    """The policy does not fit this host; nothing was changed."""

    code = "hyb.carve.nofit"
    grpc_status = "FAILED_PRECONDITION"


class VmsWouldNotFit(HostdError):
    """VMs on this host hold resources the new layout would not have; nothing was changed."""

    code = "hyb.carve.vms_would_not_fit"
    grpc_status = "FAILED_PRECONDITION"


class CarveFailed(HostdError):
    """A carve step failed and the carve was rolled back: the host is as it was."""

    code = "hyb.carve.failed"
    grpc_status = "ABORTED"


class CarveConflict(HostdError):
    """Compare-and-set: the host is not carved with the digest the caller expected to
    replace (another carve or uncarve came first); the message names what it carries and
    who made it. Nothing was changed: read the host again and decide."""

    code = "hyb.carve.conflict"
    grpc_status = "ABORTED"


class CarveRequestInvalid(HostdError):
    """A Carve or Uncarve without what makes it safe: the expected digest or the
    operation id (or a malformed one); nothing was changed."""

    code = "hyb.carve.request_invalid"
    grpc_status = "INVALID_ARGUMENT"


class CarveUnavailable(HostdError):
    """This hostd has no remote carve (an in-process test server without one)."""

    code = "hyb.carve.unavailable"
    grpc_status = "UNIMPLEMENTED"


class VmsRunning(HostdError):
    """Uncarve while VMs run (or are being created or deleted); nothing was changed."""

    code = "hyb.carve.vms_running"
    grpc_status = "FAILED_PRECONDITION"


class CarveBusy(HostdError):
    """Another carve or uncarve (this hostd's, or a `hostd carve` beside it) holds the
    host's carve lock past the wait; nothing was changed. A VM change waits for a
    carve the same way."""

    code = "hyb.carve.busy"
    grpc_status = "UNAVAILABLE"


class NotDrained(HostdError):
    """Uncarve while VMs exist and the caller did not say it drained the host."""

    code = "hyb.carve.not_drained"
    grpc_status = "FAILED_PRECONDITION"


# ---------------------------------------------------------------- live migration (hostd/apply/migration.py)

class MigrationNoDisk(HostdError):
    """The target has no free allow-listed disk of a source disk's size; nothing was
    changed on the target."""

    code = "hyb.migration.no_disk"
    grpc_status = "FAILED_PRECONDITION"


class MigrationVf(HostdError):
    """A VM's SR-IOV VF does not take this move: its request did not say how (migration
    NONE: a passed-through function cannot be migrated; nothing was changed on either
    host), or the guest or libvirt would not release an INTERRUPT VF before the job (the
    VM keeps running here with it)."""

    code = "hyb.migration.vf"
    grpc_status = "FAILED_PRECONDITION"


class MigrationNotRunning(HostdError):
    """Only a running VM is moved live."""

    code = "hyb.migration.not_running"
    grpc_status = "FAILED_PRECONDITION"


class MigrationInProgress(HostdError):
    """This VM is being moved already (by another MigrateVM call)."""

    code = "hyb.migration.in_progress"
    grpc_status = "FAILED_PRECONDITION"


class PostcopyUnsupported(HostdError):
    """Post-copy was asked for: this hostd does not switch to it (a post-copy that fails
    loses the guest, whose memory is then split between the hosts)."""

    code = "hyb.migration.postcopy_unsupported"
    grpc_status = "UNIMPLEMENTED"


class MigrationFailed(HostdError):
    """libvirt failed the migration (the detail is its reason); the VM still runs on
    the source, as it was, and the source's ledger is unchanged."""

    code = "hyb.migration.failed"
    grpc_status = "ABORTED"


class MigrationTimeout(HostdError):
    """The job did not finish within timeout_s and was cancelled; the VM still runs on
    the source."""

    code = "hyb.migration.timeout"
    grpc_status = "ABORTED"


class NotIncoming(HostdError):
    """CompleteMigration or AbortMigration for a VM this host has, but not as incoming."""

    code = "hyb.migration.not_incoming"
    grpc_status = "FAILED_PRECONDITION"


class NotArrived(HostdError):
    """CompleteMigration while no running domain of the VM is here (the migration has
    not finished, or failed: AbortMigration then)."""

    code = "hyb.migration.not_arrived"
    grpc_status = "FAILED_PRECONDITION"


class MigrationArrived(HostdError):
    """AbortMigration while the VM already runs here (the migration finished): aborting
    would destroy the one running copy. CompleteMigration instead."""

    code = "hyb.migration.arrived"
    grpc_status = "FAILED_PRECONDITION"
