"""Live migration, the scheduler's side (issue 38): a running VM moves to another host,
its memory and raw disks copied by libvirt, hostd on both ends (hostd/README.md, Live
migration). Asked by an operator (``POST /v1/vms/{id}/migrate``) or by a drain for a VM
with ``on_maintenance = "migrate"`` (scheduler/service/drains.py), through ``start``
then ``run``:

1. ``start``: checks (the VM runs, each VF says how it moves: failover or interrupt, its
   disruption group's budget, a named target
   exists, is up, active, not the source, and fits), then the target claim through the
   usual placement with the VM's own request (its anti-affinity group, the VM itself not
   counted against itself; its disks of exactly the source disks' sizes: NBD copies to
   an equal size), written with ``migration_state = preparing`` in the claim's
   transaction. The source claim stays: the VM holds both until it runs on the target.
2. ``run``: ``PrepareMigration`` on the target (always first: a target libvirtd takes
   any incoming domain, hostd's preparation is what claims and holds its disks), its
   answer adopted (the CPUs and disks the target's carve chose); ``migration_state =
   migrating`` is written *before* ``MigrateVM`` goes to the source; then
   ``CompleteMigration`` on the target, and in one transaction the source claim is
   released and the VM's record moves to the target.
3. A failure keeps exactly one running copy: hostd leaves the VM running on the source
   when MigrateVM fails, ``AbortMigration`` on the target releases what it prepared (and
   is refused by hostd once the VM runs there: then it is completed instead), and the
   target claim is released here. The failure is named in the VM's ``reason`` (starting
   with ``drain_plan.NOT_MOVED``) and in the audit (``vm.migrate``).

Where a move stands is in the VM's row (``migration_host``, ``migration_allocation``,
``migration_state``, ``migration_owner``, ``migration_at``; migration 0018), so a scheduler
that stops mid-way leaves what the next one needs: ``resume`` (each drain round) takes
over moves whose owner is gone (on SQLite, one process: any other owner; on PostgreSQL,
an owner that has not renewed its lease: ``migration.lease_s``) and settles them: ``preparing`` (MigrateVM never sent)
is undone; ``migrating`` asks the target first (CompleteMigration succeeds only where the
VM runs), then the source (GetMigration: a job still running is waited for), and only
then aborts on the target and keeps the source. The scheduler's reconcile leaves a
moving VM alone on both hosts.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from api import hostd_pb2 as pb
from api.states import HostState, MigrationResult, MigrationState, VfMigration, VmStatus
from scheduler.config import MigrationConfig
from scheduler.db.engine import Store
from scheduler.db.models import Vm
from scheduler.drain_plan import MOVE_NOTE, NOT_MOVED, budget_problem
from scheduler.errors import (ConcurrentUpdate, HostdFailed, HostNotFound, InvalidRequest, MigrationUnderWay,
                              NoValidHost, NotMovable)
from scheduler.fit import VmWant
from scheduler.metrics import Metrics
from scheduler.migration_view import last_record, progress_record, settling, with_sample
from scheduler.reconcile import alloc_of
from scheduler.repo import audit as audit_repo
from scheduler.repo import hosts as host_repo
from scheduler.repo import vms as vm_repo
from scheduler.resources import Allocation
from scheduler.service.claims import Placer
from scheduler.service.drains import load
from scheduler.service.vms import VmService, affinity_of, create_body, create_request, want_of

log = logging.getLogger(__name__)


class SchedulerStopped(Exception):
    """A test's stand-in for a scheduler killed mid-move (``MigrationService.crash_at``)."""


class MigrationHostd(Protocol):
    def get_vm(self, address: str, vm_id: str) -> pb.VM: ...
    def prepare_migration(self, address: str, req: pb.PrepareMigrationRequest) -> pb.PrepareMigrationResponse: ...
    def migrate_vm(self, address: str, req: pb.MigrateVMRequest) -> pb.MigrateVMResponse: ...
    def complete_migration(self, address: str, name: str) -> pb.CompleteMigrationResponse: ...
    def abort_migration(self, address: str, name: str) -> pb.AbortMigrationResponse: ...
    def get_migration(self, address: str, name: str) -> pb.MigrationProgress: ...


@dataclass(frozen=True)
class Move:
    """A move as its row says, with both hosts' addresses: what ``run`` acts on."""

    vm_id: str
    name: str  # hostd's name of the VM (CreateVM's)
    source: str
    source_address: str
    target: str
    target_address: str
    state: str
    hostd_vm_id: str


def hostd_name(vm: Vm) -> str:
    """hostd's name of the VM, as the scheduler's CreateVM gave it (``create_request``)."""
    return f"{vm.name}-{vm.id[:8]}"


def _says(e: HostdFailed, *codes: str) -> bool:
    """hostd's answer carries one of its stable codes (``hyb.migration.arrived`` ...)."""
    return any(c in e.message for c in codes)


class MigrationService:
    def __init__(self, *, store: Store, placer: Placer, vms: VmService, hostd: MigrationHostd | None,
                 cfg: MigrationConfig, heartbeat_timeout_s: float, clock: Callable[[], float] = time.time,
                 metrics: Metrics | None = None):
        self.store = store
        self.placer = placer
        self.vms = vms
        self.hostd = hostd
        self.cfg = cfg
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.clock = clock
        self.metrics = metrics
        self.owner = f"{socket.gethostname()[:30]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_s = cfg.lease_s
        self._pool = ThreadPoolExecutor(cfg.workers, thread_name_prefix="migrate")
        self._closed = threading.Event()
        self._busy: set[str] = set()  # VMs whose move this process drives now
        self._lock = threading.Lock()
        self.on_done: Callable[[], None] = lambda: None  # a drain round may go on (its wake)
        # tests only: stop driving a move at these points, as a killed scheduler would
        # ("claimed": before PrepareMigration; "prepared": migrating recorded, before
        # MigrateVM; "migrated": MigrateVM answered, before CompleteMigration)
        self.crash_at: set[str] = set()
        self._renewer = threading.Thread(target=self._renew_loop, name="migrate-lease", daemon=True)
        self._renewer.start()

    def close(self) -> None:
        """Stop taking moves; one under way is not waited for (a MigrateVM may block for its
        whole job): what it persisted lets the next scheduler resume or undo it."""
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._renewer.join(5)

    def _renew_loop(self) -> None:
        """The leases of the moves this process drives, renewed every third of a lease."""
        while not self._closed.wait(self.lease_s / 3):
            with self._lock:
                ids = sorted(self._busy)
            if not ids:
                continue
            try:
                with self.store.write() as s:
                    vm_repo.renew_migrations(session=s, vm_ids=ids, owner=self.owner, now=self.clock())
            except Exception:  # noqa: BLE001 - a database away: the next turn tries again
                log.exception("renewing the leases of moves %s failed", ids)

    # ------------------------------------------------------------ start

    def start(self, vm_id: str, *, target: str | None, actor: str, tenant: str | None = None,
              check_budget: bool = True) -> tuple[Vm, bool]:
        """Check, claim on the target and record the move (``preparing``); returns (the VM,
        started). A move under way already: the same VM, not started again, when no target
        or the same one is asked; ``MigrationUnderWay`` naming it otherwise. Refusals
        change nothing: ``NotMovable``/``InvalidRequest`` name the field."""
        if self.hostd is None:
            raise NotMovable("dispatch to hostd is off: nothing can move", field="vm_id")
        with self.store.read() as s:
            vm = vm_repo.get_vm(session=s, vm_id=vm_id, tenant=tenant)
            if vm.migration_state:
                if target in (None, vm.migration_host):
                    return vm, False
                raise MigrationUnderWay(f"the VM is moving live to {vm.migration_host} already "
                                        f"({vm.migration_state}); wait for it", field="target_host",
                                        extra={"target_host": vm.migration_host, "state": vm.migration_state})
            if vm.status != VmStatus.RUNNING or not vm.host or not vm.allocation or not vm.hostd_vm_id:
                raise NotMovable(f"the VM is {vm.status}: only a running VM moves live", field="vm_id")
            body = create_body(vm.request)
            for i, vf in enumerate(body.vfs):
                if vf.migration == VfMigration.NONE:
                    raise NotMovable("a VM with an SR-IOV VF does not move live with migration=none (a passed-"
                                     "through function cannot be migrated): create it with migration=failover "
                                     "or interrupt, or replace or stop it", field=f"vfs[{i}].migration")
            if check_budget and vm.disruption_group:
                rows = load(s, [vm.host])  # the drain's own view of the group
                mine = next(d for d in rows if d.id == vm.id)
                why = budget_problem(mine, [d for d in rows if d.group == mine.group])
                if why:
                    raise NotMovable(f"its disruption budget is spent: {why}", field="disruption_budget")
            src = host_repo.get_host(session=s, name=vm.host)
            src_res = self.placer.cache.res(s, src)
            exclude = {vm.host}
            if target is not None:
                self._check_target(s, vm, target)
                exclude |= {h.name for h in host_repo.list_hosts(session=s) if h.name != target}
        want = target_want(want_of(body, self.vms.default_policy), Allocation.from_dict(vm.allocation), src_res)
        aff = replace(affinity_of(body), ignore=vm.id)
        source, now = vm.host, self.clock()

        def write_vm(s: Any, host: str, alloc: Allocation) -> Vm:
            r = vm_repo.get_vm(session=s, vm_id=vm_id)
            if r.migration_state or r.status != VmStatus.RUNNING or r.host != source:
                raise ConcurrentUpdate(f"the VM changed meanwhile ({r.status} on {r.host}); ask again")
            r.migration_host, r.migration_allocation = host, alloc.to_dict()
            r.migration_state, r.migration_owner, r.migration_at = MigrationState.PREPARING, self.owner, now
            r.migration_progress = progress_record(now)
            audit_repo.record(session=s, principal=actor, action="vm.migrate", target=vm_id, now=now,
                              detail={"tenant": r.tenant, "from": source, "to": host, "result": "started",
                                      "cpus": list(alloc.cpus), "disks": [d.name for d in alloc.disks]})
            return r
        try:
            got = self.placer.claim(want, aff, write_vm, exclude=frozenset(exclude))
        except NoValidHost as e:
            if target is not None:
                raise NotMovable(f"the VM does not fit on {target}: {e.message}", field="target_host",
                                 extra=e.extra) from None
            raise
        log.info("migration started vm=%s from=%s to=%s by=%s", vm_id, source, got.migration_host, actor)
        self._count("started")  # with MigrationResult's done and failed: the counter's labels
        return got, True

    def ask(self, vm_id: str, *, target: str | None, actor: str) -> tuple[Vm, bool]:
        """An operator's move (the API's ``POST /v1/vms/{id}/migrate``, the console's
        button): ``start``, then ``run`` in the background when it started."""
        vm, started = self.start(vm_id, target=target, actor=actor)
        if started:
            self.submit(vm.id)
        return vm, started

    def _check_target(self, s: Any, vm: Vm, target: str) -> None:
        try:
            h = host_repo.get_host(session=s, name=target)
        except HostNotFound:
            raise InvalidRequest(f"no host named {target!r}", field="target_host") from None
        if h.name == vm.host:
            raise NotMovable(f"the VM runs on {target} already", field="target_host")
        state = host_repo.effective_state(h, now=self.clock(), heartbeat_timeout_s=self.heartbeat_timeout_s,
                                          pulse=self.placer.cache.pulse)
        if state != HostState.ACTIVE:
            raise NotMovable(f"{target} is {state}: only an active host that is up takes VMs", field="target_host")

    # ------------------------------------------------------------ run

    def submit(self, vm_id: str) -> bool:
        """``run`` in the background unless this process drives the move already."""
        with self._lock:
            if vm_id in self._busy:
                return False
            self._busy.add(vm_id)
        self._pool.submit(self._background, vm_id)
        return True

    def _background(self, vm_id: str) -> None:
        """``run``; a move that settled wakes the drain loop (its host may be drained now,
        the next VM may go). One still waiting for a hostd does not: the drain's next
        round resumes it, ``[drain] interval_s`` later. Waking it at once asked a target
        whose hostd was restarting ~15 times a second, until gRPC's reconnect backoff
        failed every call at once and the move was undone as the host went down."""
        settled = False
        try:
            settled = self.run(vm_id, held=True) != "waiting"
        except Exception:  # noqa: BLE001 - logged; resume sees the row and acts again
            log.exception("migration of vm=%s stopped; the next round resumes it", vm_id)
        finally:
            with self._lock:
                self._busy.discard(vm_id)
            if settled:
                self.on_done()

    def run(self, vm_id: str, *, held: bool = False) -> str:
        """Drive the move to its end: "done" (it runs on the target), "failed" (undone: it
        runs on the source), or "waiting" (a hostd cannot tell yet: resumed later)."""
        if not held:
            with self._lock:
                if vm_id in self._busy:
                    return "waiting"
                self._busy.add(vm_id)
        try:
            mv = self._move(vm_id)
            if mv is None:
                return "done"
            if mv.state == MigrationState.PREPARING:
                return self._from_prepare(mv)
            return self._settle(mv, "")
        finally:
            if not held:
                with self._lock:
                    self._busy.discard(vm_id)

    def _move(self, vm_id: str) -> Move | None:
        with self.store.read() as s:
            vm = vm_repo.get_vm(session=s, vm_id=vm_id)
            if not vm.migration_state or not vm.host or not vm.migration_host:
                return None
            src = host_repo.get_host(session=s, name=vm.host)
            dst = host_repo.get_host(session=s, name=vm.migration_host)
            return Move(vm.id, hostd_name(vm), src.name, src.address, dst.name, dst.address, vm.migration_state,
                        vm.hostd_vm_id)

    def _crash(self, point: str) -> None:
        if point in self.crash_at:
            raise SchedulerStopped(f"stopped at {point} (test)")

    def _from_prepare(self, mv: Move) -> str:
        assert self.hostd is not None
        self._crash("claimed")
        with self.store.read() as s:
            vm = vm_repo.get_vm(session=s, vm_id=mv.vm_id)
            src_res = self.placer.cache.res(s, host_repo.get_host(session=s, name=mv.source))
            alloc = Allocation.from_dict(vm.migration_allocation or {})
            source_alloc = Allocation.from_dict(vm.allocation or {})
            req = create_request(vm, alloc)
        sizes = {d.name: d.size_bytes for d in src_res.disks}
        try:
            on_source = self.hostd.get_vm(mv.source_address, mv.hostd_vm_id)
            serials = {d.disk: d.serial for d in on_source.disks}
            req.ClearField("disks")  # disks[i].disk: the source's; the target picks its own
            req.disks.extend(pb.DiskRequest(disk=a.name, iotune=d.iotune, atomic_write_bytes=d.atomic_write_bytes)
                             for a, d in zip(source_alloc.disks, create_request(vm, source_alloc).disks))
            ready = self.hostd.prepare_migration(mv.target_address, pb.PrepareMigrationRequest(
                request_id=f"migrate-{mv.vm_id}", vm_id=mv.hostd_vm_id, vm=req, source_host=mv.source,
                source_disks=[pb.SourceDisk(disk=a.name, size_bytes=sizes.get(a.name, 0),
                                            serial=serials.get(a.name, ""))
                              for a in source_alloc.disks]))
        except HostdFailed as e:
            return self._undo_prepared(mv, f"PrepareMigration on {mv.target}: {e.message}")
        with self.store.write() as s:  # the target's carve decides: its CPUs and disks adopted, then migrating
            r = vm_repo.get_vm(session=s, vm_id=mv.vm_id)
            if r.migration_host != mv.target or r.migration_owner != self.owner:
                log.warning("migration of vm=%s was taken over meanwhile; leaving it", mv.vm_id)
                return "waiting"
            got = alloc_of(ready.vm)
            old = Allocation.from_dict(r.migration_allocation or {})
            if got != old:
                self.placer.release_on(s, mv.target, old, mv.vm_id, then=got)
                r.migration_allocation = got.to_dict()
            r.migration_state, r.migration_at = MigrationState.MIGRATING, self.clock()
            record = dict(r.migration_progress or {})
        log.info("migration prepared vm=%s on %s cpus=%s; migrating from %s", mv.vm_id, mv.target,
                 list(ready.vm.vcpu_pins), mv.source)
        mv = replace(mv, state=MigrationState.MIGRATING)
        self._crash("prepared")
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(mv, record, stop), daemon=True,
                                   name=f"migrate-progress-{mv.vm_id[:8]}")
        watcher.start()
        failure = ""
        try:
            moved = self.hostd.migrate_vm(mv.source_address, pb.MigrateVMRequest(
                name=mv.name, target_uri=ready.target_uri, migrate_uri=ready.migrate_uri,
                domain_xml=ready.domain_xml, migrate_disks=[d.target for d in ready.disks if d.target],
                bandwidth_mib_s=self.cfg.bandwidth_mib_s, max_downtime_ms=self.cfg.max_downtime_ms,
                timeout_s=self.cfg.timeout_s, on_timeout=pb.ON_TIMEOUT_ABORT, tls=self.cfg.tls))
        except HostdFailed as e:
            failure = f"MigrateVM on {mv.source}: {e.message}"
        finally:  # whatever MigrateVM did, its job is over: no more samples
            self._watched(mv, stop, watcher)
        if failure:
            return self._settle(mv, failure)
        self._crash("migrated")
        return self._settle(mv, "", moved)

    def _settle(self, mv: Move, failure: str, moved: pb.MigrateVMResponse | None = None) -> str:
        """Where does the VM run? The target first (CompleteMigration succeeds only where it
        runs), then the source (a job still running is waited for); only then the target
        is aborted and the source kept."""
        assert self.hostd is not None
        try:
            done = self.hostd.complete_migration(mv.target_address, mv.name)
            return self._finish(mv, done, moved)
        except HostdFailed as e:
            if not _says(e, "hyb.migration.not_arrived", "hyb.migration.not_incoming", "hyb.vm.not_found"):
                self._note(mv, f"{failure or 'resumed'}; {mv.target} cannot say yet ({e.message}): asked again "
                               "next round")
                return "waiting"
        try:
            job = self.hostd.get_migration(mv.source_address, mv.name)
            if job.active:  # the job runs still (a scheduler that restarted meanwhile): its sample kept
                self._keep(mv, lambda rec: with_sample(rec, job, self.clock()))
                return "waiting"
        except HostdFailed as e:
            if not _says(e, "hyb.vm.not_found") and e.extra.get("grpc_code") != "NOT_FOUND":
                self._note(mv, f"{failure or 'resumed'}; {mv.source} cannot say yet ({e.message}): asked again "
                               "next round")
                return "waiting"
        try:
            self.hostd.abort_migration(mv.target_address, mv.name)
        except HostdFailed as e:
            if _says(e, "hyb.migration.arrived"):  # it ran there after all
                return self._finish(mv, self.hostd.complete_migration(mv.target_address, mv.name), moved)
            self._note(mv, f"{failure}; AbortMigration on {mv.target}: {e.message}: asked again next round")
            return "waiting"
        self._undo(mv, failure or "the move did not finish (a scheduler stopped mid-way); undone")
        return "failed"

    def _undo_prepared(self, mv: Move, failure: str) -> str:
        """MigrateVM was never sent: the VM runs on the source. The target's preparation
        is aborted (idempotent); a target that cannot answer and is down is let go (its
        hostd releases an incoming VM without a domain when it starts)."""
        assert self.hostd is not None
        try:
            self.hostd.abort_migration(mv.target_address, mv.name)
        except HostdFailed as e:
            with self.store.read() as s:
                h = host_repo.get_host(session=s, name=mv.target)
                down = host_repo.effective_state(h, now=self.clock(), heartbeat_timeout_s=self.heartbeat_timeout_s,
                                                 pulse=self.placer.cache.pulse) == HostState.DOWN
            if not down:
                self._note(mv, f"{failure}; AbortMigration on {mv.target}: {e.message}: asked again next round")
                return "waiting"
        self._undo(mv, failure)
        return "failed"

    def _finish(self, mv: Move, done: pb.CompleteMigrationResponse, moved: pb.MigrateVMResponse | None) -> str:
        job = done.job if done.job.completed_record or moved is None else moved
        now = self.clock()
        with self.store.write() as s:
            r = vm_repo.get_vm(session=s, vm_id=mv.vm_id)
            if r.migration_host != mv.target:
                return "waiting"
            alloc = Allocation.from_dict(r.migration_allocation or {})
            if list(done.vm.vcpu_pins) and list(done.vm.vcpu_pins) != list(alloc.cpus):
                new = replace(alloc, cpus=tuple(done.vm.vcpu_pins))
                self.placer.release_on(s, mv.target, alloc, mv.vm_id, then=new)
                alloc = new
            self.placer.release(s, r)  # the source claim: the VM left it
            r.host, r.allocation, r.hostd_vm_id = mv.target, alloc.to_dict(), done.vm.vm_id or r.hostd_vm_id
            r.last_migration = last = last_record(
                source=mv.source, target=mv.target, result=MigrationResult.DONE, reason="",
                record=r.migration_progress, finished=now, job_ms=job.job_ms, downtime_ms=job.downtime_ms,
                data_bytes=job.data_bytes)
            _clear(r)
            if r.reason.startswith(MOVE_NOTE):
                r.reason = ""
            r.updated = now
            audit_repo.record(session=s, principal=f"migration:{mv.source}", action="vm.migrate", target=mv.vm_id,
                              now=now, detail={"tenant": r.tenant, "from": mv.source, "to": mv.target,
                                               "result": MigrationResult.DONE, "job_ms": job.job_ms,
                                               "downtime_ms": job.downtime_ms, "data_bytes": job.data_bytes,
                                               "total_s": last["total_s"]})
        log.info("migration done vm=%s %s -> %s job_ms=%d downtime_ms=%d", mv.vm_id, mv.source, mv.target,
                 job.job_ms, job.downtime_ms)
        self._count(MigrationResult.DONE, last["total_s"])
        return "done"

    def _undo(self, mv: Move, failure: str) -> None:
        now = self.clock()
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        note = f"{NOT_MOVED}: to {mv.target} ({at}): {failure}; it runs on {mv.source}"
        with self.store.write() as s:
            r = vm_repo.get_vm(session=s, vm_id=mv.vm_id)
            if r.migration_host != mv.target:
                return
            if r.migration_allocation:
                self.placer.release_on(s, mv.target, Allocation.from_dict(r.migration_allocation), mv.vm_id)
            r.last_migration = last = last_record(source=mv.source, target=mv.target, result=MigrationResult.FAILED,
                                                  reason=failure, record=r.migration_progress, finished=now)
            _clear(r)
            if not r.reason or r.reason.startswith(MOVE_NOTE):
                r.reason = note
            r.updated = now
            audit_repo.record(session=s, principal=f"migration:{mv.source}", action="vm.migrate", target=mv.vm_id,
                              now=now, detail={"tenant": r.tenant, "from": mv.source, "to": mv.target,
                                               "result": MigrationResult.FAILED, "reason": failure,
                                               "total_s": last["total_s"]})
        log.warning("migration failed vm=%s %s -> %s, it runs on %s: %s", mv.vm_id, mv.source, mv.target,
                    mv.source, failure)
        self._count(MigrationResult.FAILED, last["total_s"])

    def _note(self, mv: Move, what: str) -> None:
        log.warning("migration vm=%s %s -> %s: %s", mv.vm_id, mv.source, mv.target, what)
        self.vms.note(mv.vm_id, f"{MOVE_NOTE} to {mv.target} not settled yet: {what}", prefix=MOVE_NOTE)

    def _count(self, result: str, total_s: float | None = None) -> None:
        if self.metrics is not None:
            self.metrics.migrations.labels(result).inc()
            if total_s is not None:
                self.metrics.migration_seconds.labels(result).observe(total_s)

    # ------------------------------------------------------------ progress

    def _watch(self, mv: Move, record: dict, stop: threading.Event) -> None:
        """While MigrateVM runs: the source's job sampled every ``progress_s`` and kept on
        the VM's row (what every replica serves; scheduler/migration_view.py)."""
        assert self.hostd is not None
        while not stop.wait(self.cfg.progress_s) and not self._closed.is_set():
            try:
                p = self.hostd.get_migration(mv.source_address, mv.name)
            except HostdFailed as e:  # the move's own calls decide; a sample is only shown
                log.debug("progress of vm=%s from %s: %s", mv.vm_id, mv.source, e.message)
                continue
            if stop.is_set():
                return  # MigrateVM answered meanwhile: settling is written, not this sample
            record = with_sample(record, p, self.clock())
            self._keep(mv, lambda _rec, r=record: r)

    def _watched(self, mv: Move, stop: threading.Event, watcher: threading.Thread) -> None:
        """MigrateVM answered: the sampler stopped, the move shown settling."""
        stop.set()
        watcher.join(30)
        self._keep(mv, settling)

    def _keep(self, mv: Move, change: Callable[[dict | None], dict]) -> None:
        """The move's progress record changed by ``change``, iff the VM still moves to its
        target; a database away costs only the shown progress."""
        try:
            with self.store.write() as s:
                r = vm_repo.get_vm(session=s, vm_id=mv.vm_id)
                if r.migration_state and r.migration_host == mv.target:
                    vm_repo.set_migration_progress(session=s, vm_id=mv.vm_id, target=mv.target,
                                                   record=change(r.migration_progress))
        except Exception:  # noqa: BLE001 - see above
            log.exception("keeping the progress of vm=%s's move failed", mv.vm_id)

    # ------------------------------------------------------------ resume

    def resume(self) -> list[str]:
        """Moves no process drives (their owner stopped): taken over and settled in the
        background. Returns the VM ids taken."""
        if self.hostd is None:
            return []
        now = self.clock()
        with self.store.read() as s:
            rows = [(v.id, v.migration_owner, v.migration_at) for v in vm_repo.moving(session=s)]
        taken = []
        for vm_id, owner, at in rows:
            with self._lock:
                if vm_id in self._busy:
                    continue
            if owner != self.owner and not self.store.sqlite and now - at < self.lease_s:
                continue  # another replica's lease, renewed: it drives it
            with self.store.write() as s:
                if not vm_repo.take_migration(session=s, vm_id=vm_id, owner=self.owner, seen_owner=owner,
                                              seen_at=at, now=now):
                    continue
            if self.submit(vm_id):
                log.info("migration of vm=%s resumed (owner was %s)", vm_id, owner or "none")
                taken.append(vm_id)
        return taken


def _clear(r: Vm) -> None:
    r.migration_host, r.migration_allocation = None, None
    r.migration_state, r.migration_owner, r.migration_at = "", "", 0.0
    r.migration_progress = None


def target_want(want: VmWant, source: Allocation, res: Any) -> VmWant:
    """The VM's own request for its target: each disk any free one of the source disk's
    class and *exactly* its size (the NBD copy needs equal sizes), its throttles kept."""
    by_name = {d.name: d for d in res.disks}
    disks = []
    for w, a in zip(want.disks, source.disks):
        d = by_name.get(a.name)
        if d is None:
            raise NotMovable(f"{a.name} is not in its host's layout any more", field="disks")
        disks.append(replace(w, disk="", cls=d.cls, min_size_bytes=0, exact_size_bytes=d.size_bytes))
    return replace(want, disks=tuple(disks))



