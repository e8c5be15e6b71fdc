"""The gRPC face of hostd (api/hostd.proto): messages <-> VmManager, errors -> status.

Every failed call carries the status its error class names (``grpc_status`` in
hostd/errors.py) and a message that starts with the stable error code and names the
field: ``hyb.vm.refused [disks[0].disk]: nvme1n1 cannot be used now: mounted at /mnt``.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import sys
from collections.abc import Callable, Iterator

import grpc

from api import hostd_pb2 as pb
from api import hostd_pb2_grpc as pb_grpc
from api.bounds import check_vm_id
from api.jsonmodel import to_jsonable
from api.states import VfMigration
from hostd.apply.carve_service import Asker, CarveService
from hostd.apply.carve_state import boot_changes, boot_pending
from hostd.apply.ledger import VmRecord, VmState
from hostd.apply.migration import MigrateRequest, Migrations, SourceDisk
from hostd.apply.vms import VmEvent, VmManager
from hostd.carve.vmclaim import CellReq, VfReq
from hostd.carve.vmspec import DiskSpec, IoTune, VmSpec
from hostd.errors import CarveRequestInvalid, CarveUnavailable, HostdError, SpecInvalid
from hostd.health.sampler import Sampler
from hostd.health.signal import HostStats
from hostd.metrics import Metrics
from hostd.rpc.callers import CallerCheck, peer_identities

log = logging.getLogger(__name__)

_STATES = {VmState.CREATING: pb.VM_STATE_CREATING, VmState.RUNNING: pb.VM_STATE_RUNNING,
           VmState.STOPPED: pb.VM_STATE_STOPPED, VmState.FAILED: pb.VM_STATE_FAILED,
           VmState.DELETING: pb.VM_STATE_DELETING, VmState.DELETED: pb.VM_STATE_DELETING,
           VmState.INCOMING: pb.VM_STATE_INCOMING, VmState.MIGRATING: pb.VM_STATE_MIGRATING}

EVENT_QUEUE = 1024  # per WatchEvents stream; a stream that falls this far behind is ended
# A status message carries the code, the field and the reason; never a caller's 4 MB
# value echoed back (a status travels in HTTP/2 trailers, which have their own limit).
STATUS_MAX = 1024


def _clip(text: str) -> str:
    return text if len(text) <= STATUS_MAX else text[:STATUS_MAX - 3] + "..."


def _vm_id_bound(vm_id: str) -> None:
    try:
        check_vm_id(vm_id)
    except ValueError as e:
        raise SpecInvalid(str(e), field="vm_id") from None


def _iotune(m: pb.IoTune) -> IoTune:
    """By field name: the proto message and the spec carry the same fields
    (tests/api/test_iotune_fields.py keeps them so)."""
    return IoTune(**{f.name: getattr(m, f.name) for f in dataclasses.fields(IoTune)})


# hostd.proto VfMigration <-> api.states.VfMigration (an unknown number stays a number:
# spec_problem refuses it naming vfs[i].migration)
_VF_MIGRATION = {pb.VF_MIGRATION_NONE: VfMigration.NONE, pb.VF_MIGRATION_FAILOVER: VfMigration.FAILOVER,
                 pb.VF_MIGRATION_INTERRUPT: VfMigration.INTERRUPT}
_VF_MIGRATION_PB = {v: k for k, v in _VF_MIGRATION.items()}


def spec_from_proto(r: pb.CreateVMRequest) -> VmSpec:
    if not r.request_id:
        raise SpecInvalid("required (the idempotency key)", field="request_id")
    if not r.image:
        raise SpecInvalid("required", field="image")
    node = r.placement.numa_node if r.HasField("placement") else None
    cpus = tuple(r.placement.cpus) if r.HasField("placement") else ()
    cells = tuple(CellReq(c.numa_node, len(c.cpus), c.memory_mib, tuple(c.cpus)) for c in r.placement.cells)
    if cells:
        node, cpus = None, ()
    return VmSpec(
        request_id=r.request_id, name=r.name, vcpus=r.vcpus, memory_mib=r.memory_mib,
        image=r.image, hugepage_size_kb=r.hugepage_size_kb or 2048, profile=r.profile, node=node,
        disks=tuple(DiskSpec(d.disk, _iotune(d.iotune), atomic_write_bytes=d.atomic_write_bytes) for d in r.disks),
        vfs=tuple(VfReq(v.pf, v.mac.lower(), v.vlan, v.max_tx_rate_mbps, v.min_tx_rate_mbps,
                        _VF_MIGRATION.get(v.migration, str(v.migration))) for v in r.vfs),
        guest_numa=r.guest_numa, labels=dict(r.labels), cpus=cpus, cells=cells)


def vm_to_proto(rec: VmRecord, m: VmManager) -> pb.VM:
    spec = VmSpec.from_dict(rec.spec)
    tunes = {m.disk_name(d.disk) or d.disk: d.iotune for d in spec.disks}
    serials = {m.disk_name(d.disk) or d.disk: d.serial for d in spec.disks}
    c = rec.claim
    return pb.VM(
        vm_id=rec.vm_id, request_id=rec.request_id, name=rec.name,
        state=_STATES.get(rec.state, pb.VM_STATE_UNSPECIFIED), reason=rec.reason,
        numa_node=c.node, vcpu_pins=list(c.vcpu_pins), emulator_cpus=list(c.emulator_cpus),
        memory_mib=spec.memory_mib, hugepage_size_kb=c.size_kb,
        disks=[pb.ClaimedDisk(disk=d.name, device=f"/dev/{d.name}", serial=serials.get(d.name) or d.name,
                              iotune=pb.IoTune(**to_jsonable(tunes.get(d.name, IoTune()))))
               for d in c.disks],
        vfs=[pb.ClaimedVf(pf=v.pf, index=v.index, pci=m.vf_pci.get((v.pf, v.index), ""), mac=v.mac,
                          vlan=v.vlan, max_tx_rate_mbps=v.max_tx_rate_mbps,
                          min_tx_rate_mbps=v.min_tx_rate_mbps, migration=_VF_MIGRATION_PB.get(sv.migration, 0))
             for v, sv in zip(c.vfs, spec.vfs)],
        image=spec.image, labels=spec.labels, created_unix=int(rec.created),
        cells=[pb.NumaCell(numa_node=cell.node, cpus=list(pins), memory_mib=cell.pages * c.size_kb // 1024)
               for cell, pins in zip(c.numa_cells, c.cell_pins())])


def stats_to_proto(s: HostStats) -> pb.HostStats:
    opt = {k: v for k, v in (("psi_some_avg10", s.psi_some_avg10), ("psi_some_stall", s.psi_some_stall),
                             ("probe_p50_ms", s.probe_p50_ms), ("probe_p99_ms", s.probe_p99_ms)) if v is not None}
    return pb.HostStats(
        at_unix=s.at, interval_seconds=s.interval_s, io_cpus=list(s.io_cpus), io_cpu_busy=s.io_cpu_busy,
        cpu_io_service=s.cpu_io_service, cpu_vms=s.cpu_vms, cpu_other=s.cpu_other,
        foreign_threads=s.foreign_threads, foreign_kernel_threads=s.foreign_kernel_threads,
        foreign_cpu_seconds=s.foreign_cpu_s, foreign_kernel_cpu_seconds=s.foreign_kernel_cpu_s,
        irqs_on_io_cpus_per_second=s.irqs_on_io_cpus_per_s,
        throttled_periods=s.throttled_periods, throttled_ms=s.throttled_ms, probe_ok=s.probe_ok,
        probe_failed=s.probe_failed,
        top_foreign=[pb.ForeignThread(pid=f.pid, tid=f.tid, comm=f.comm, kernel=f.kthread, cpu=f.cpu,
                                      cpu_seconds=f.cpu_s) for f in s.top_foreign],
        top_irqs=[pb.IrqRate(irq=i.irq, name=i.name, per_second=i.per_s) for i in s.top_irqs], **opt)


class HostdService(pb_grpc.HostdServicer):
    """``layout_json`` is what GetInventory reports until a carve changes the manager's
    layout; from then on the manager's. ``carver``: the carve service (the same one
    `hostd carve` calls; None: the four carve RPCs answer hyb.carve.unavailable)."""

    def __init__(self, manager: VmManager, *, host: str, layout_json: str,
                 health: Callable[[], pb.HealthResponse], metrics: Metrics | None = None,
                 callers: CallerCheck = CallerCheck(frozenset({"scheduler"})), sampler: Sampler | None = None,
                 carver: CarveService | None = None, version: str = "",
                 migrations: Migrations | None = None):
        self.m = manager
        self.migrations = migrations or Migrations(manager)
        self.callers = callers
        self.sampler = sampler
        self.host = host
        self._layout = (manager.layout, layout_json)
        self.health = health
        self.metrics = metrics
        self.carver = carver
        self.version = version

    @property
    def layout_json(self) -> str:
        if self.m.layout is not self._layout[0]:
            self._layout = (self.m.layout, self.m.layout.to_json(None))
        return self._layout[1]

    def _carver(self) -> CarveService:
        if self.carver is None:
            raise CarveUnavailable("this hostd was started without the remote carve", field="carve")
        return self.carver

    def _count(self, method: str, code: str) -> None:
        if self.metrics:
            self.metrics.rpc.labels(method, code).inc()

    def _call(self, ctx: grpc.ServicerContext, fn: Callable[[], object]) -> object:
        method = sys._getframe(1).f_code.co_name  # the RPC handler that called us
        try:
            self.callers.check(ctx, method)
            out = fn()
        except HostdError as e:
            code = grpc.StatusCode[type(e).grpc_status]
            log.info("rpc refused method=%s code=%s field=%s detail=%s", method, e.code, e.field,
                     _clip(e.detail))
            self._count(method, e.code)
            ctx.abort(code, _clip(str(e)))
        except Exception as e:  # never leak a traceback as the status message
            log.exception("rpc failed method=%s", method)
            self._count(method, "hyb.hostd.internal")
            ctx.abort(grpc.StatusCode.INTERNAL, _clip(f"hyb.hostd.internal: {type(e).__name__}: {e}"))
        self._count(method, "ok")
        return out

    def _vm(self, rec: VmRecord) -> pb.VM:
        return vm_to_proto(rec, self.m)

    def CreateVM(self, request, context):
        return self._call(context, lambda: self._vm(self.m.create(spec_from_proto(request))))

    def DeleteVM(self, request, context):
        return self._call(context, lambda: (self.m.delete(request.vm_id, request.grace_seconds),
                                            pb.DeleteVMResponse())[1])

    def GetVM(self, request, context):
        return self._call(context, lambda: self._vm(self.m.get(request.vm_id)))

    def ListVMs(self, request, context):
        return self._call(context, lambda: pb.ListVMsResponse(
            vms=[self._vm(r) for r in self.m.list(request.label_selector)]))

    def StartVM(self, request, context):
        return self._call(context, lambda: self._vm(self.m.start(request.vm_id)))

    def StopVM(self, request, context):
        return self._call(context, lambda: self._vm(self.m.stop(request.vm_id, request.grace_seconds)))

    def UpdateIOLimits(self, request, context):
        return self._call(context, lambda: self._vm(self.m.update_io(
            request.vm_id, [DiskSpec(d.disk, _iotune(d.iotune)) for d in request.disks],
            [(v.vf_pci, v.max_tx_rate_mbps, v.min_tx_rate_mbps) for v in request.vfs])))

    def GetInventory(self, request, context):
        def inv() -> pb.Inventory:
            d = self.m.inventory()
            return pb.Inventory(
                host=self.host, generation=d["generation"], layout_json=self.layout_json,
                nodes=[pb.NodeInventory(node=n["node"], vm_cpus=n["vm_cpus"], used_cpus=n["used_cpus"],
                                        hugepages=[pb.PoolUsage(**h) for h in n["hugepages"]])
                       for n in d["nodes"]],
                pfs=[pb.PfInventory(**p) for p in d["pfs"]],
                disks=[pb.DiskInventory(**x) for x in d["disks"]])
        return self._call(context, inv)

    def Health(self, request, context):
        return self._call(context, self.health)

    def GetHostStats(self, request, context):
        def stats() -> pb.HostStatsResponse:
            s = self.sampler
            if s is None:
                return pb.HostStatsResponse(host=self.host)
            return pb.HostStatsResponse(host=self.host, interval_seconds=s.interval_s,
                                        probe=s.probe.spec if s.probe else "",
                                        samples=[stats_to_proto(x) for x in s.latest(max(1, request.last))])
        return self._call(context, stats)

    # ------------------------------------------------------------ the remote carve

    def GetHostInfo(self, request, context):
        def info() -> pb.HostInfo:
            i = self._carver().info()
            return pb.HostInfo(host=self.host, hostd_version=self.version, carved_policy_digest=i.carved_digest,
                               journal_steps=i.journal_steps, reboot_pending=i.reboot_pending, vms=i.vms,
                               vms_running=i.vms_running, started_unix=i.started_unix,
                               policy_digest=i.policy_digest, carved_policy_toml=i.carved_policy_toml,
                               carve_operation=i.carve_operation, carved_by=i.carved_by,
                               carved_unix=i.carved_unix)
        return self._call(context, info)

    def PlanCarve(self, request, context):
        def plan() -> pb.PlanCarveResponse:
            p = self._carver().plan(request.policy_toml)
            out = pb.PlanCarveResponse(policy_digest=p.digest, already_carved=p.already_carved)
            if p.nofit is not None:
                out.nofit.CopyFrom(pb.NoFitReason(field=p.nofit.field, reason=p.nofit.reason))
                return out
            assert p.layout is not None
            out.layout_json = p.layout.to_json(None)
            out.reboot_required.extend(boot_changes(p.layout))
            out.steps.extend(s.describe() for s in p.steps)
            out.cannot_move.extend(p.cannot_move)
            out.vm_conflicts.extend(p.vm_conflicts)
            return out
        return self._call(context, plan)

    @staticmethod
    def _asker(request, context) -> Asker:  # type: ignore[no-untyped-def]
        """Who asks (the caller's certificate name) and what it expects to replace: both
        required over the API (the command line at the host may skip the comparison)."""
        if not request.HasField("expected_digest"):
            raise CarveRequestInvalid("required: the carved digest this change replaces (\"\" = uncarved; "
                                      "GetHostInfo.carved_policy_digest)", field="expected_digest")
        who = peer_identities(context)
        return Asker(request.expected_digest, request.operation_id, who[0] if who else "plaintext")

    def Carve(self, request, context):
        def carve() -> pb.CarveResponse:
            carver = self._carver()
            c = carver.carve(request.policy_toml, self._asker(request, context), digest=request.policy_digest)
            return pb.CarveResponse(policy_digest=c.digest, changed=c.changed,
                                    steps=[s.describe() for s in c.steps], cannot_move=c.cannot_move,
                                    reboot_required=boot_pending(c.layout, carver.where.root))
        return self._call(context, carve)

    def Uncarve(self, request, context):
        return self._call(context, lambda: pb.UncarveResponse(
            steps=[s.describe() for s in self._carver().uncarve(self._asker(request, context),
                                                                  drained=request.drained)]))

    def WatchEvents(self, request, context) -> Iterator[pb.VMEvent]:
        if request.vm_id:  # "" watches every VM; an id out of bounds is refused (one unknown yet is not)
            self._call(context, lambda: _vm_id_bound(request.vm_id))
        q: queue.Queue[VmEvent | None] = queue.Queue(EVENT_QUEUE)

        def push(ev: VmEvent) -> None:
            if request.vm_id and ev.vm_id != request.vm_id:
                return
            try:
                q.put_nowait(ev)
            except queue.Full:
                log.warning("event stream fell behind; ending it")
                context.cancel()

        unwatch = self.m.watch(push)
        # the stream's initial metadata says it watches: a client that waits for it
        # (call.initial_metadata()) gets every change after that moment
        context.send_initial_metadata(())
        context.add_callback(lambda: q.put(None) if not q.full() else None)
        try:
            while context.is_active():
                try:
                    ev = q.get(timeout=1.0)
                except queue.Empty:
                    continue
                if ev is None:
                    break
                yield pb.VMEvent(vm_id=ev.vm_id, state=_STATES.get(ev.state, pb.VM_STATE_UNSPECIFIED),
                                 reason=ev.reason, time_unix_ns=ev.time_ns)
        finally:
            unwatch()

    # ------------------------------------------------------------ live migration

    def PrepareMigration(self, request, context):
        def prepare() -> pb.PrepareMigrationResponse:
            p = self.migrations.prepare(
                request_id=request.request_id, vm_id=request.vm_id, spec=spec_from_proto(request.vm),
                source_disks=tuple(SourceDisk(d.disk, d.size_bytes, d.serial) for d in request.source_disks),
                source_host=request.source_host)
            vm = self._vm(p.record)
            targets = dict(p.disks)
            for d in vm.disks:
                d.target = targets.get(d.disk, "")
            return pb.PrepareMigrationResponse(domain_xml=p.domain_xml, migrate_uri=p.migrate_uri, vm=vm,
                                               disks=vm.disks, target_uri=self.migrations.target_uri)
        return self._call(context, prepare)

    def MigrateVM(self, request, context):
        def migrate() -> pb.MigrateVMResponse:
            if request.on_timeout not in pb.OnTimeout.values():
                raise SpecInvalid(f"{request.on_timeout} is not an OnTimeout value", field="on_timeout")
            f = self.migrations.migrate(MigrateRequest(
                name=request.name, target_uri=request.target_uri, domain_xml=request.domain_xml,
                migrate_uri=request.migrate_uri, migrate_disks=tuple(request.migrate_disks),
                bandwidth_mib_s=request.bandwidth_mib_s, max_downtime_ms=request.max_downtime_ms,
                timeout_s=request.timeout_s, postcopy=request.on_timeout == pb.ON_TIMEOUT_POSTCOPY,
                tls=request.tls))
            return pb.MigrateVMResponse(**dataclasses.asdict(f))
        return self._call(context, migrate)

    def CompleteMigration(self, request, context):
        def complete() -> pb.CompleteMigrationResponse:
            rec, job = self.migrations.complete(request.name)
            return pb.CompleteMigrationResponse(vm=self._vm(rec), job=pb.MigrateVMResponse(**dataclasses.asdict(job)))
        return self._call(context, complete)

    def AbortMigration(self, request, context):
        return self._call(context, lambda: pb.AbortMigrationResponse(steps=self.migrations.abort(request.name)))

    def GetMigration(self, request, context):
        return self._call(context, lambda: pb.MigrationProgress(
            **dataclasses.asdict(self.migrations.progress(request.name))))
