"""hostd's failures, all in one place.

Two shapes:

- ``NoFit`` is a *value*: what a pure planner returns when the request cannot be had
  (the carve planner for a policy on a host, the claim check for a VM on a layout).
  It names the field at fault and the reason; it is never ``None``.
- ``HostdError`` and its subclasses are *raised*. Each has a stable code (never
  reused) that the CLI prints and the gRPC layer returns, and names the field or
  object at fault: ``hyb.vm.refused [disks[0].disk]: nvme1n1 cannot be used now``.

Parse errors of the small pure helpers (``CpuListError``, ``PolicyError``,
``ElementError``, ``api.jsonmodel.SchemaError``) stay ``ValueError``s beside their
parsers; the layer that calls them turns them into one of the errors below.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NoFit:
    """The request cannot be honoured here. ``field`` names the key that asked for
    too much (a policy key, a VM request field) or the host part that is missing."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


class HostdError(Exception):
    code = "hyb.hostd.error"

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


class StartupError(HostdError):
    code = "hyb.hostd.startup"


class BadPolicy(HostdError):
    code = "hyb.host.bad_policy"


class BadTopology(HostdError):
    code = "hyb.host.bad_topology"


class Forbidden(HostdError):
    """The caller's certificate is the fleet CA's, but not one allowed to do this."""

    code = "hyb.rpc.forbidden"


# ---------------------------------------------------------------- the live carve (apply/)

class DeviceBusy(HostdError):
    """A sysfs/cgroupfs write kept answering EBUSY after bounded retries."""

    code = "hyb.host.device_busy"


class ApplyFailed(HostdError):
    """A carve step failed; every step before it was rolled back."""

    code = "hyb.host.apply_failed"


class NotCarved(HostdError):
    code = "hyb.host.not_carved"


class IoServiceNotFound(HostdError):
    code = "hyb.host.io_service_not_found"


# ---------------------------------------------------------------- VMs

class SpecInvalid(HostdError):
    """The request is malformed (a required field is missing)."""

    code = "hyb.spec.invalid"


class Refused(HostdError):
    """The request cannot be honoured here; nothing was changed."""

    code = "hyb.vm.refused"


class NotFound(HostdError):
    code = "hyb.vm.not_found"


class Conflict(HostdError):
    code = "hyb.vm.conflict"


class LedgerConflict(Conflict):
    """The ledger's own keys refused a row (double booking, a reused request id)."""


class CreateFailed(HostdError):
    code = "hyb.vm.create_failed"


class DomainDesignError(HostdError):
    """The VM cannot be turned into a domain as asked; nothing was defined."""

    code = "hyb.vm.bad_domain"


class BadMetadata(HostdError):
    code = "hyb.vm.bad_metadata"


class LibvirtUnavailable(HostdError):
    code = "hyb.host.libvirt_unavailable"


class DomainError(HostdError):
    code = "hyb.vm.libvirt_error"


# ---------------------------------------------------------------- images and guest profiles

class UnknownImage(HostdError):
    code = "hyb.image.unknown"


class BadImage(HostdError):
    code = "hyb.image.bad"


class GuestProfileError(HostdError):
    code = "hyb.guest_profile.bad"


class UnknownProfile(HostdError):
    code = "hyb.guest_profile.unknown"


# ---------------------------------------------------------------- remote carve (fleet-rollout's RPCs)

class PolicyInvalid(HostdError):
    """A policy given in a request does not parse or validate (the caller's; a bad
    policy *file* of this host is ``BadPolicy``)."""

    code = "hyb.policy.invalid"


class DigestMismatch(HostdError):
    """The policy digest the caller planned with is not the digest of the text it sent."""

    code = "hyb.policy.digest_mismatch"


class CarveNoFit(HostdError):
    """The policy does not fit this host; nothing was changed."""

    code = "hyb.carve.nofit"


class VmsWouldNotFit(HostdError):
    """VMs on this host hold resources the new layout would not have; nothing was changed."""

    code = "hyb.carve.vms_would_not_fit"


class CarveFailed(HostdError):
    """A carve step failed and the carve was rolled back: the host is as it was."""

    code = "hyb.carve.failed"


class CarveUnavailable(HostdError):
    """This hostd has no remote carve (an in-process test server without one)."""

    code = "hyb.carve.unavailable"


class VmsRunning(HostdError):
    """Uncarve while VMs run (or are being created or deleted); nothing was changed."""

    code = "hyb.carve.vms_running"


class NotDrained(HostdError):
    """Uncarve while VMs exist and the caller did not say it drained the host."""

    code = "hyb.carve.not_drained"
