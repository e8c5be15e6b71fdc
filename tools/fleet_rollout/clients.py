"""What the controller acts through: hostd's gRPC API (mTLS, the ``fleet-rollout``
client certificate, which hostd lets call Carve/Uncarve) and the scheduler's REST API
(cordon/uncordon, the host list). Errors become ``HostUnreachable`` (the host counts as
failed) or ``HostRefused`` (hostd's own error code and message, kept for the record)."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from api import hostd_pb2 as pb
from api import hostd_pb2_grpc as pb_grpc
from api.rest import ApiError, ApiUnreachable, RestClient
from api.states import AdminState
from tools.fleet_rollout.gates import Sample

UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class HostError(Exception):
    pass


class HostUnreachable(HostError):
    pass


class HostRefused(HostError):
    """hostd answered with an error: ``code`` is its hyb.* code ("" if it had none)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = message.split(" ", 1)[0] if message.startswith("hyb.") else ""


@dataclass(frozen=True)
class Tls:
    ca: Path
    cert: Path
    key: Path

    @classmethod
    def from_dir(cls, d: Path, name: str = "fleet-rollout") -> Tls:
        return cls(d / "ca.crt", d / f"{name}.crt", d / f"{name}.key")


@dataclass
class HostInfo:
    version: str
    carved_digest: str
    journal_steps: int
    reboot_pending: list[str]
    vms: int
    vms_running: int
    started: float
    carved_policy: str = ""  # the carved policy's text (what a rollback carves again)
    carve_operation: str = ""  # who made the carve the host carries: the operation id,
    carved_by: str = ""  # the caller's certificate name

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "carved_policy"}

    def carve_owner(self) -> str:
        """The carve the host carries and who made it, for a report."""
        if not self.carved_digest:
            return "uncarved"
        return (f"carved with {self.carved_digest[:12]} by {self.carved_by or '(unrecorded)'} "
                f"(operation {self.carve_operation or '(unrecorded)'})")


def sample_of(s: pb.HostStats) -> Sample:
    return Sample(at=s.at_unix,
                  psi_some_avg10=s.psi_some_avg10 if s.HasField("psi_some_avg10") else None,
                  probe_p99_ms=s.probe_p99_ms if s.HasField("probe_p99_ms") else None,
                  # user threads only: per-CPU kernel threads stay on io_cpus whatever the carve does
                  foreign_cpu=(max(0.0, s.foreign_cpu_seconds - s.foreign_kernel_cpu_seconds) / s.interval_seconds
                               if s.interval_seconds else 0.0),
                  probe_failed=s.probe_failed)


@dataclass
class HostdClients:
    """One channel per hostd address, opened on first use."""

    tls: Tls | None  # None: plaintext (local development)
    timeout_s: float = 10.0
    _channels: dict[str, tuple[grpc.Channel, pb_grpc.HostdStub]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _stub(self, address: str) -> pb_grpc.HostdStub:
        with self._lock:
            if address not in self._channels:
                if self.tls is None:
                    ch = grpc.insecure_channel(address)
                else:
                    creds = grpc.ssl_channel_credentials(self.tls.ca.read_bytes(), self.tls.key.read_bytes(),
                                                         self.tls.cert.read_bytes())
                    ch = grpc.secure_channel(address, creds)
                self._channels[address] = (ch, pb_grpc.HostdStub(ch))
            return self._channels[address][1]

    def close(self) -> None:
        with self._lock:
            for ch, _ in self._channels.values():
                ch.close()
            self._channels.clear()

    def _call(self, address: str, method: str, req: object, timeout_s: float | None = None):  # type: ignore[no-untyped-def]
        try:
            return getattr(self._stub(address), method)(req, timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as e:
            code = e.code()  # type: ignore[attr-defined]
            if code in UNREACHABLE:
                raise HostUnreachable(f"{address}: {code.name.lower()}: {e.details()}") from None  # type: ignore[attr-defined]
            raise HostRefused(e.details() or code.name) from None  # type: ignore[attr-defined]

    def info(self, address: str) -> HostInfo:
        r = self._call(address, "GetHostInfo", pb.GetHostInfoRequest())
        return HostInfo(r.hostd_version, r.carved_policy_digest, r.journal_steps, list(r.reboot_pending),
                        r.vms, r.vms_running, r.started_unix, r.carved_policy_toml, r.carve_operation, r.carved_by)

    def plan_carve(self, address: str, policy: str) -> pb.PlanCarveResponse:
        return self._call(address, "PlanCarve", pb.PlanCarveRequest(policy_toml=policy))

    def carve(self, address: str, policy: str, digest: str, *, expected: str, operation: str) -> pb.CarveResponse:
        """Carve ``policy`` if the host carries ``expected`` ("" = uncarved): else
        HostRefused with code hyb.carve.conflict naming what it carries and who made it."""
        req = pb.CarveRequest(policy_toml=policy, policy_digest=digest, expected_digest=expected,
                              operation_id=operation)
        return self._call(address, "Carve", req, timeout_s=max(self.timeout_s, 120))

    def uncarve(self, address: str, *, drained: bool, expected: str, operation: str) -> pb.UncarveResponse:
        req = pb.UncarveRequest(drained=drained, expected_digest=expected, operation_id=operation)
        return self._call(address, "Uncarve", req, timeout_s=max(self.timeout_s, 120))

    def stats(self, address: str, last: int) -> tuple[float, list[Sample]]:
        r = self._call(address, "GetHostStats", pb.GetHostStatsRequest(last=last))
        return r.interval_seconds, [sample_of(s) for s in r.samples]

    def vm_ids(self, address: str) -> set[str]:
        return {v.vm_id for v in self._call(address, "ListVMs", pb.ListVMsRequest()).vms}


# the scheduler's refusals (api/rest.py): ``code`` is the API's error code
# (hyb.host.admin_owned ...); SchedulerUnreachable is no answer or a 5xx, worth asking
# again (the engine retries for limits.unreachable_s)
SchedulerError = ApiError
SchedulerUnreachable = ApiUnreachable


class Scheduler(RestClient):
    """The scheduler's REST API with an admin token: cordon and uncordon hosts, and the
    rollouts' state (tools/fleet_rollout/store.py). ``http``: a client to use instead of
    one made from ``url`` and ``token`` (the tests' in-process scheduler)."""

    def hosts(self) -> list[dict]:
        return self.every_page("/v1/hosts")

    def host(self, name: str) -> dict:
        return self.request("GET", f"/v1/hosts/{name}")

    def drain_status(self, name: str) -> dict:
        """What the host's drain does or waits for, per VM (``GET /v1/hosts/{name}/drain``)."""
        return self.request("GET", f"/v1/hosts/{name}/drain")

    def set_state(self, name: str, state: str, *, rollout: str, fence: int, reason: str = "") -> None:
        """Cordon, drain or uncordon as ``rollout``'s controller, under its lease's
        ``fence`` (the scheduler records the hold as ``rollout:<rollout>``): refused
        (SchedulerError) while another owner holds the host (hyb.host.admin_owned), or
        when the fence is no longer the lease's (hyb.rollout.stale_fence, lease_lost)."""
        verb = {AdminState.ACTIVE: "uncordon", AdminState.CORDONED: "cordon", AdminState.DRAINING: "drain"}[state]
        self.request("POST", f"/v1/hosts/{name}/{verb}", json={"rollout": rollout, "fence": fence, "reason": reason})


def run_hook(argv: list[str], host: str, address: str, timeout_s: float) -> tuple[int, str]:
    """The operator's reboot/upgrade command for one host ({host}, {address} substituted)."""
    args = [a.replace("{host}", host).replace("{address}", address) for a in argv]
    t0 = time.monotonic()
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout_s:.0f} s"
    except OSError as e:
        return -1, f"{args[0]}: {e.strerror}"
    tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
    return r.returncode, f"exit {r.returncode} in {time.monotonic() - t0:.1f} s {tail[0]}".strip()
