"""hostd's domain errors. Each has a stable code (never reused) that the CLI
prints and the gRPC layer returns, and names the field or object at fault."""

from __future__ import annotations


class HostdError(Exception):
    code = "hyb.hostd.error"

    def __init__(self, detail: str, *, field: str | None = None):
        super().__init__(detail)
        self.detail = detail
        self.field = field

    def __str__(self) -> str:
        where = f" [{self.field}]" if self.field else ""
        return f"{self.code}{where}: {self.detail}"


class DeviceBusy(HostdError):
    """A sysfs/cgroupfs write kept answering EBUSY after bounded retries."""

    code = "hyb.host.device_busy"


class ApplyFailed(HostdError):
    """A carve step failed; every step before it was rolled back."""

    code = "hyb.host.apply_failed"


class HugepageShortfall(HostdError):
    """The kernel allocated fewer hugepages than asked (fragmented memory)."""

    code = "hyb.host.hugepage_shortfall"


class NotCarved(HostdError):
    code = "hyb.host.not_carved"


class IoServiceNotFound(HostdError):
    code = "hyb.host.io_service_not_found"


class NoFitError(HostdError):
    code = "hyb.host.no_fit"
