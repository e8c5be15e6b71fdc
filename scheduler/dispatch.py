"""gRPC client to hostd (api/hostd.proto) over mTLS: one channel per host address,
certificate paths from the scheduler config. gRPC failures become ``HostdFailed``
carrying hostd's stable code line (``hyb.vm.refused [vcpus]: ...``)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import grpc

from api import hostd_pb2 as pb
from api import hostd_pb2_grpc as pb_grpc
from scheduler.config import DispatchConfig
from scheduler.errors import HostdFailed

log = logging.getLogger(__name__)


class HostdClients:
    def __init__(self, cfg: DispatchConfig):
        self.cfg = cfg
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._creds: grpc.ChannelCredentials | None = None

    def _credentials(self) -> grpc.ChannelCredentials:
        if self._creds is None:
            self._creds = grpc.ssl_channel_credentials(
                Path(self.cfg.ca).read_bytes(), private_key=Path(self.cfg.key).read_bytes(),
                certificate_chain=Path(self.cfg.cert).read_bytes())
        return self._creds

    def stub(self, address: str) -> pb_grpc.HostdStub:
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                opts = [("grpc.ssl_target_name_override", self.cfg.server_name)] if self.cfg.server_name else []
                ch = grpc.secure_channel(address, self._credentials(), options=opts)
                self._channels[address] = ch
            return pb_grpc.HostdStub(ch)

    def _call(self, address: str, method: str, req, timeout: float | None = None):  # type: ignore[no-untyped-def]
        try:
            return getattr(self.stub(address), method)(req, timeout=timeout or self.cfg.timeout_s)
        except grpc.RpcError as e:
            code = e.code().name if e.code() else "UNKNOWN"
            raise HostdFailed(f"{method} on {address}: {e.details() or code}",
                              extra={"grpc_code": code}) from e

    def create(self, address: str, req: pb.CreateVMRequest) -> pb.VM:
        return self._call(address, "CreateVM", req)

    def delete(self, address: str, vm_id: str, grace_seconds: int = 0) -> None:
        try:
            self._call(address, "DeleteVM", pb.DeleteVMRequest(vm_id=vm_id, grace_seconds=grace_seconds))
        except HostdFailed as e:
            if e.extra.get("grpc_code") != "NOT_FOUND":
                raise

    def update_io(self, address: str, vm_id: str, disks: list[pb.DiskRequest],
                  vfs: list[pb.VfRateUpdate] | None = None) -> pb.VM:
        return self._call(address, "UpdateIOLimits", pb.UpdateIOLimitsRequest(vm_id=vm_id, disks=disks,
                                                                              vfs=vfs or []))

    # ---- live migration (api/hostd.proto): the scheduler runs Prepare on the target,
    # MigrateVM on the source, then Complete (or Abort) on the target

    def get_vm(self, address: str, vm_id: str) -> pb.VM:
        return self._call(address, "GetVM", pb.GetVMRequest(vm_id=vm_id))

    def prepare_migration(self, address: str, req: pb.PrepareMigrationRequest) -> pb.PrepareMigrationResponse:
        return self._call(address, "PrepareMigration", req, timeout=max(self.cfg.timeout_s, 120))

    def migrate_vm(self, address: str, req: pb.MigrateVMRequest) -> pb.MigrateVMResponse:
        # blocks for the whole job: its own bound, and then some for the answer
        return self._call(address, "MigrateVM", req, timeout=(req.timeout_s or 86_400) + 120)

    def complete_migration(self, address: str, name: str) -> pb.CompleteMigrationResponse:
        return self._call(address, "CompleteMigration", pb.MigrationRef(name=name), timeout=60)

    def abort_migration(self, address: str, name: str) -> pb.AbortMigrationResponse:
        return self._call(address, "AbortMigration", pb.MigrationRef(name=name), timeout=60)

    def get_migration(self, address: str, name: str) -> pb.MigrationProgress:
        return self._call(address, "GetMigration", pb.MigrationRef(name=name), timeout=30)

    def list_vms(self, address: str) -> list[pb.VM]:
        return list(self._call(address, "ListVMs", pb.ListVMsRequest(), timeout=30).vms)

    def inventory(self, address: str) -> pb.Inventory:
        return self._call(address, "GetInventory", pb.GetInventoryRequest(), timeout=30)

    def close(self) -> None:
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()
