"""VM lifecycle on the scheduler side: create (idempotent, claim in one transaction),
dispatch to hostd (pending -> creating -> running | failed, next candidate on failure,
bounded), delete (hostd first, then release), live IO-limit changes within budgets."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api import bounds
from api import hostd_pb2 as pb
from api.states import OnMaintenance, VmStatus
from scheduler.db.engine import Store
from scheduler.db.models import LIVE, Vm
from scheduler.errors import (ConcurrentUpdate, HostdFailed, IdempotencyMismatch, InvalidRequest, NoValidHost,
                              VmBusy)
from scheduler.fit import DiskWant, FitResult, VfWant, VmWant, validate
from scheduler.metrics import Metrics
from scheduler.migration_view import last_migration_json, migration_json
from scheduler.repo import audit as audit_repo
from scheduler.repo import hosts as host_repo
from scheduler.repo import vms as vm_repo
from scheduler.resources import Allocation, DiskAlloc, Usage, VfAlloc, split_cells
from scheduler.schemas.vms import (CandidateOut, IoTuneIn, LastMigrationOut, MigrationOut, PlacementOut,
                                   PreviewPublic, RejectionOut, VmCreate, VmPublic, VmsPublic)
from scheduler.service.claimq import ClaimQueue
from scheduler.service.claims import Affinity, ClaimJob, Placer

log = logging.getLogger(__name__)


class Hostd(Protocol):
    def create(self, address: str, req: pb.CreateVMRequest) -> pb.VM: ...
    def delete(self, address: str, vm_id: str, grace_seconds: int = 0) -> None: ...
    def update_io(self, address: str, vm_id: str, disks: list[pb.DiskRequest],
                  vfs: list[pb.VfRateUpdate] | None = None) -> pb.VM: ...


def want_of(body: VmCreate, default_policy: str) -> VmWant:
    want = VmWant(
        vcpus=body.vcpus, memory_mib=body.memory_mib, page_size_kb=body.page_size_kb,
        vfs=tuple(VfWant(v.pf, v.max_tx_rate_mbps, v.min_tx_rate_mbps) for v in body.vfs),
        disks=tuple(DiskWant(d.disk, d.cls, d.min_size_bytes, d.iotune.bytes_sec(), d.iotune.iops(),
                             d.atomic_write_bytes) for d in body.disks),
        allow_span_nodes=body.allow_span_nodes, policy=body.policy or default_policy,
        labels=tuple(sorted(body.host_labels.items())))
    bad = validate(want)
    if bad:
        raise InvalidRequest(bad[0][1], field=bad[0][0].replace("page_size_kb", "page_size_kb"))
    out = bounds_problem(body)
    if out:
        raise InvalidRequest(out[1], field=out[0])
    return want


def bounds_problem(body: VmCreate) -> tuple[str, str] | None:
    """(field, reason) for what hostd would refuse (api/bounds.py, hostd/README.md) of a
    request the schema lets through. Checked when a request comes in, not in the schema:
    a stored request is validated again each time it is read (listing, dispatch, a
    drain's replacement), and one stored before a bound existed must still list."""
    checks: list[tuple[str, Callable[[], object]]] = [
        ("image", lambda: bounds.check_image(body.image)),
        ("profile", lambda: bounds.check_profile(body.profile)),
        ("labels", lambda: bounds.check_labels(body.labels, most=bounds.USER_LABELS_MAX,
                                               most_bytes=bounds.USER_LABELS_BYTES_MAX))]
    for field, check in checks:
        try:
            check()
        except ValueError as e:
            return field, str(e)
    for i, d in enumerate(body.disks):
        bad = bounds.iotune_problem(d.iotune.model_dump())
        if bad:
            return f"disks[{i}].iotune.{bad[0]}", bad[1]
        try:
            bounds.check_atomic_write_bytes(d.atomic_write_bytes)
        except ValueError as e:
            return f"disks[{i}].atomic_write_bytes", str(e)
    return None


def create_body(request: dict[str, Any]) -> VmCreate:
    """The body a VM's stored ``request`` was made from (the tenant it records is the
    caller's, not the body's): what a replacement, a retry elsewhere, a start or a move
    places again."""
    return VmCreate.model_validate({k: v for k, v in request.items() if k != "tenant"})


def affinity_of(body: VmCreate, *, replaces: str = "") -> Affinity:
    """The request's anti-affinity. ``replaces``: the VM this one replaces (a drain's
    replacement) is not counted against it, as a VM moving live is not counted against
    itself: it runs until its replacement does, then goes, and with rack scope it would
    keep its replacement out of its whole rack."""
    if not body.anti_affinity:
        return Affinity()
    return Affinity(body.anti_affinity.group, body.anti_affinity.scope, ignore=replaces)


# Fields added after requests were first hashed, with their defaults: a request that
# leaves them at the default hashes as it did before they existed, so an Idempotency-Key
# recorded by an older scheduler still replays. ``on_maintenance`` not given (None, the
# fleet's default since) hashes as ``block`` did.
LATER_DEFAULTS: dict[str, Any] = {"on_maintenance": OnMaintenance.BLOCK, "disruption_budget": None}
UNSET_LATER = {"on_maintenance"}


# The same for fields added to each disk.
LATER_DISK_DEFAULTS: dict[str, Any] = {"atomic_write_bytes": 0}


def hashed(req: dict[str, Any]) -> dict[str, Any]:
    """``req`` as its hash sees it: the later fields left out where they are default."""
    out = {k: v for k, v in req.items()
           if k not in LATER_DEFAULTS or not (v == LATER_DEFAULTS[k] or (v is None and k in UNSET_LATER))}
    if isinstance(out.get("disks"), list):
        out["disks"] = [{k: v for k, v in d.items() if k not in LATER_DISK_DEFAULTS or v != LATER_DISK_DEFAULTS[k]}
                        if isinstance(d, dict) else d for d in out["disks"]]
    return out


def request_hash(req: dict[str, Any]) -> str:
    """SHA-256 of the request as compact JSON with sorted keys (orjson: a tenth of
    ``json.dumps``' time, which was 5 % of the event loop's per create)."""
    return hashlib.sha256(orjson.dumps(req, option=orjson.OPT_SORT_KEYS)).hexdigest()


def request_hash_v1(req: dict[str, Any]) -> str:
    """The hash schedulers stored before ``request_hash`` (``json.dumps`` spacing): a
    replay of a key they recorded still matches."""
    return hashlib.sha256(json.dumps(req, sort_keys=True).encode()).hexdigest()


def create_request(vm: Vm, alloc: Allocation) -> pb.CreateVMRequest:
    body = VmCreate.model_validate(vm.request)
    disks = [pb.DiskRequest(disk=a.name, iotune=pb.IoTune(**d.iotune.model_dump()),
                            atomic_write_bytes=d.atomic_write_bytes)
             for a, d in zip(alloc.disks, body.disks)]
    vfs = [pb.VfRequest(pf=a.pf, mac=v.mac, vlan=v.vlan, max_tx_rate_mbps=v.max_tx_rate_mbps,
                        min_tx_rate_mbps=v.min_tx_rate_mbps,
                        migration=pb.VfMigration.Value(f"VF_MIGRATION_{v.migration.upper()}"))
           for a, v in zip(alloc.vfs, body.vfs)]
    if alloc.cell_vcpus:  # spanning: one guest NUMA cell per host node, memory bound to it
        size = body.page_size_kb
        placement = pb.Placement(cells=[pb.NumaCell(numa_node=node, cpus=list(cpus), memory_mib=pages * size // 1024)
                                        for node, cpus, pages in alloc.cells()])
    else:
        placement = pb.Placement(numa_node=alloc.nodes[0], cpus=list(alloc.cpus))
    labels = dict(body.labels) | {"hyb.vm": vm.id, "hyb.tenant": vm.tenant, "hyb.name": vm.name}
    return pb.CreateVMRequest(
        request_id=vm.id, name=f"{vm.name}-{vm.id[:8]}", vcpus=body.vcpus, memory_mib=body.memory_mib,
        hugepage_size_kb=body.page_size_kb, image=body.image, profile=body.profile, disks=disks, vfs=vfs,
        placement=placement, guest_numa=body.guest_numa, labels=labels)


def cells_json(nodes: Sequence[int], cpus: Sequence[int], pages: Sequence[Sequence[int]],
               cell_vcpus: Sequence[int]) -> list[dict]:
    """The guest NUMA cells of an allocation (its fields, or its stored dict's), as JSON."""
    size = pages[0][1] if pages else 0  # one page size per VM
    return [{"node": node, "cpus": list(c), "memory_mib": n * size // 1024}
            for node, c, n in split_cells(nodes, cpus, pages, cell_vcpus)]


def placement_public(a: Allocation) -> PlacementOut:
    return PlacementOut(nodes=list(a.nodes), cpus=list(a.cpus),
                        hugepages=[{"node": n, "size_kb": s, "count": c} for n, s, c in a.pages],
                        vfs=[v.__dict__ for v in a.vfs], disks=[d.__dict__ for d in a.disks],
                        cells=cells_json(a.nodes, a.cpus, a.pages, a.cell_vcpus))


class _StartedMeanwhile(Exception):
    """A start's claim found the VM no longer stopped (a concurrent start won)."""


def not_moving(vm: Vm) -> None:
    """VmBusy while the VM moves live: it is on two hosts until the move settles."""
    if vm.migration_state:
        raise VmBusy(f"the VM is moving live to {vm.migration_host} ({vm.migration_state}); retry when the "
                     "move is done", field="vm_id", extra={"target_host": vm.migration_host})


def migration_public(vm: Vm, now: float | None = None) -> MigrationOut | None:
    """The move under way (scheduler/migration_view.py), its progress aged at ``now``."""
    got = migration_json(vm, time.time() if now is None else now)
    return None if got is None else MigrationOut.model_validate(got)


def vm_public(vm: Vm, now: float | None = None) -> VmPublic:
    req = {k: v for k, v in vm.request.items() if k != "tenant"}
    last = last_migration_json(vm)
    return VmPublic(id=vm.id, name=vm.name, tenant=vm.tenant, status=vm.status, reason=vm.reason, host=vm.host,
                    replaces=vm.replaces,
                    placement=placement_public(Allocation.from_dict(vm.allocation)) if vm.allocation else None,
                    hostd_vm_id=vm.hostd_vm_id, attempts=vm.attempts, request=VmCreate.model_validate(req),
                    migration=migration_public(vm, now),
                    last_migration=None if last is None else LastMigrationOut.model_validate(last),
                    created=vm.created, updated=vm.updated)


def preview_public(res: FitResult) -> PreviewPublic:
    best = res.candidates[0] if res.candidates else None
    return PreviewPublic(
        fits=best is not None, host=best.host if best else None,
        placement=placement_public(best.alloc) if best else None,
        candidates=[CandidateOut(host=c.host, placement=placement_public(c.alloc)) for c in res.candidates],
        rejections=res.counts, examined=res.examined,
        rejected_hosts=[RejectionOut(host=r.host, resource=r.resource, reason=r.reason)
                        for r in sorted(res.rejections, key=lambda r: r.host)[:100]])


@dataclass(frozen=True)
class CreateItem:
    """A validated create request, ready to claim."""

    body: VmCreate
    tenant: str
    key: str
    actor: str
    want: VmWant
    req: dict[str, Any]
    digest: str
    replaces: str = ""  # a drain's replacement: the VM it replaces


class VmService:
    def __init__(self, *, store: Store, placer: Placer, hostd: Hostd | None, default_policy: str,
                 max_attempts: int, metrics: Metrics | None = None,
                 clock: Callable[[], float] = time.time, claim_batch: int = 64,
                 on_maintenance: str = OnMaintenance.BLOCK):
        self.store = store
        self.on_maintenance = OnMaintenance(on_maintenance)  # the fleet's default (``drain.on_maintenance``)
        self.placer = placer
        self.hostd = hostd
        self.default_policy = default_policy
        self.max_attempts = max(1, max_attempts)
        self.metrics = metrics
        self.clock = clock
        self.claims = ClaimQueue(self.create_many, max_batch=claim_batch)
        self._dispatching: set[str] = set()  # VMs this process is dispatching now
        self._dlock = threading.Lock()

    def close(self) -> None:
        self.claims.close()

    # ------------------------------------------------------------ create

    def prepare(self, body: VmCreate, *, tenant: str, key: str, actor: str, replaces: str = "") -> CreateItem:
        """Validate (InvalidRequest names the field) before anything queues or claims."""
        want = want_of(body, self.default_policy)
        req = body.model_dump(mode="json", by_alias=True) | {"tenant": tenant}
        digest = request_hash(hashed(req))  # the request as sent: not given hashes as not given
        if req.get("on_maintenance") is None:  # the fleet's default, recorded with the VM
            req["on_maintenance"] = str(self.on_maintenance)
        return CreateItem(body, tenant, key, actor, want, req, digest, replaces)

    def create(self, body: VmCreate, *, tenant: str, key: str, actor: str) -> tuple[Vm, bool]:
        """Returns (vm, replayed). Same key + same body = the same VM, never a second one."""
        got = self.create_many([self.prepare(body, tenant=tenant, key=key, actor=actor)])[0]
        if isinstance(got, BaseException):
            raise got
        return got

    async def create_async(self, body: VmCreate, *, tenant: str, key: str, actor: str) -> tuple[Vm, bool]:
        """``create`` through the claim thread (batched with whatever else is queued)."""
        item = self.prepare(body, tenant=tenant, key=key, actor=actor)
        return await self.claims.submit(item, asyncio.get_running_loop())  # type: ignore[misc]

    def create_many(self, items: list[CreateItem], more: Callable[[], list[CreateItem]] | None = None
                    ) -> list[tuple[Vm, bool] | BaseException]:
        """Claim ``items`` in one batch (``Placer.claim_many``): idempotent replays are
        found in the batch transaction, each VM row is written with its claim. ``more``
        (the claim thread's): requests that queued meanwhile, taken into the batch once
        it holds the writer lock; the answers cover them too, after ``items``."""
        items = list(items)
        jobs = self._jobs(items)

        def late() -> list[ClaimJob]:
            got = more() if more is not None else []
            items.extend(got)
            return self._jobs(got)

        def replays(s: Session, js: list[ClaimJob]) -> None:
            prior = vm_repo.find_by_keys(session=s, keys=[(it.tenant, it.key) for it in items])
            for it, j in zip(items, js):
                j.done = prior.get((it.tenant, it.key))
        self.placer.claim_many(jobs, replays, more=late if more is not None else None)
        out: list[tuple[Vm, bool] | BaseException] = []
        for it, j in zip(items, jobs):
            try:
                out.append(self._settle(it, j))
            except Exception as e:  # noqa: BLE001 - handed to the request
                out.append(e)
        return out

    def _jobs(self, items: list[CreateItem]) -> list[ClaimJob]:
        if not items:
            return []
        raw = os.urandom(16 * len(items))  # one getrandom() for the batch's VM ids
        ids = [str(uuid.UUID(bytes=raw[16 * i:16 * i + 16], version=4)) for i in range(len(items))]
        return [ClaimJob(it.want, affinity_of(it.body, replaces=it.replaces), self._writer(it, vm_id))
                for it, vm_id in zip(items, ids)]

    def _settle(self, it: CreateItem, j: ClaimJob) -> tuple[Vm, bool]:
        if j.done is not None:
            return self._replay(j.done, it), True
        if isinstance(j.error, IntegrityError):  # a concurrent request with the same key won
            with self.store.read() as s:
                prior = vm_repo.find_by_key(session=s, tenant=it.tenant, key=it.key)
            if prior is None:
                raise j.error
            return self._replay(prior, it), True
        if j.error is not None:
            raise j.error
        vm = j.vm
        assert vm is not None
        log.info("vm claimed vm=%s tenant=%s host=%s cpus=%s", vm.id, it.tenant, vm.host,
                 vm.allocation["cpus"] if vm.allocation else [])
        return vm, False

    def _writer(self, it: CreateItem, vm_id: str) -> Callable[[Session, str, Allocation], Vm]:
        body = it.body

        def write_vm(s: Session, host: str, alloc: Allocation) -> Vm:
            now = self.clock()
            vm = Vm(id=vm_id, tenant=it.tenant, name=body.name, idempotency_key=it.key, request_hash=it.digest,
                    request=it.req, host=host, allocation=alloc.to_dict(), status=VmStatus.PENDING, reason="",
                    hostd_vm_id="", affinity_group=body.anti_affinity.group if body.anti_affinity else "",
                    attempts=0, replaces=it.replaces or None, migration_host=None, migration_allocation=None,
                    migration_state="", migration_owner="", migration_at=0.0, migration_progress=None,
                    last_migration=None,
                    disruption_group=body.disruption_budget.group if body.disruption_budget else "",
                    created=now, updated=now)
            vm_repo.insert_vm(session=s, vm=vm)  # the unique (tenant, key) constraint fires here
            audit_repo.record(session=s, principal=it.actor, action="vm.create", target=vm_id, now=now,
                              detail={"tenant": it.tenant, "host": host, "nodes": list(alloc.nodes),
                                      "cpus": list(alloc.cpus)})
            return vm
        return write_vm

    @staticmethod
    def _replay(prior: Vm, it: CreateItem) -> Vm:
        if prior.request_hash != it.digest and prior.request_hash != request_hash_v1(hashed(it.req)):
            raise IdempotencyMismatch("Idempotency-Key was used with a different request",
                                      field="Idempotency-Key")
        return prior

    def preview(self, body: VmCreate) -> PreviewPublic:
        """Where ``body`` would go and why the other hosts were rejected; nothing claimed."""
        return preview_public(self.placer.preview(want_of(body, self.default_policy), affinity_of(body)))

    # ------------------------------------------------------------ reads

    def get(self, vm_id: str, *, scope: str | None) -> VmPublic:
        """``scope``: the tenant the reader is limited to (None: every tenant); another
        tenant's VM is not found."""
        with self.store.read() as s:
            return vm_public(vm_repo.get_vm(session=s, vm_id=vm_id, tenant=scope), self.clock())

    def moving(self, host: str, *, scope: str | None) -> list[VmPublic]:
        """The VMs moving live from or to ``host`` (a reader limited to a tenant: its own),
        each with its move's progress."""
        with self.store.read() as s:
            now = self.clock()
            return [vm_public(v, now) for v in vm_repo.moving_at(session=s, host=host, tenant=scope)]

    def list(self, *, scope: str | None, tenant: str | None = None, host: str | None = None,
             status: str | None = None, name: str | None = None, limit: int = 100, after: str = "") -> VmsPublic:
        """By id, ``limit`` after ``after``; ``next`` is the ``after`` of the next page, None
        on the last. A reader limited to a tenant (``scope``) sees only its VMs, whatever
        ``tenant`` it names."""
        with self.store.read() as s:
            rows = vm_repo.list_vms(session=s, tenant=scope if scope is not None else tenant, host=host,
                                    status=status, name=name, limit=limit, after=after)
            now = self.clock()
            items = [vm_public(v, now) for v in rows]
        return VmsPublic(items=items, next=items[-1].id if len(items) == limit else None)

    def status_counts(self) -> dict[str, int]:
        with self.store.read() as s:
            return vm_repo.count_by_status(session=s)

    # ------------------------------------------------------------ dispatch

    def dispatch(self, vm_id: str) -> Vm:
        """Drive a pending VM to running or failed. On a hostd failure the claim is
        released and the next candidate (excluding hosts that failed) is claimed."""
        with self._dlock:
            self._dispatching.add(vm_id)
        try:
            return self._dispatch(vm_id)
        finally:
            with self._dlock:
                self._dispatching.discard(vm_id)

    def orphaned(self, vm: Vm, *, now: float, after_s: float) -> bool:
        """A VM left ``pending`` or ``creating`` by a scheduler that stopped mid-dispatch:
        not dispatched by this process, and (PostgreSQL: another replica may be
        dispatching it) unchanged for ``after_s``; on SQLite (one process) at once."""
        if vm.status not in (VmStatus.PENDING, VmStatus.CREATING) or self.hostd is None:
            return False
        with self._dlock:
            if vm.id in self._dispatching:
                return False
        return self.store.sqlite or now - vm.updated > after_s

    def redispatch(self, vm_id: str) -> Vm:
        """Dispatch an orphaned VM again: one left ``creating`` is ``pending`` again first
        (hostd's CreateVM answers the VM it made for this request id, or makes it)."""
        with self.store.write() as s:
            vm_repo.set_status(session=s, vm_id=vm_id, expect=(VmStatus.CREATING,), status=VmStatus.PENDING,
                               reason="dispatched again: the scheduler dispatching it stopped", now=self.clock())
        log.info("vm dispatched again vm=%s (left pending or creating)", vm_id)
        return self.dispatch(vm_id)

    def _dispatch(self, vm_id: str) -> Vm:
        failed_hosts: list[str] = []
        reasons: list[str] = []
        while True:
            with self.store.write() as s:
                vm = vm_repo.get_vm(session=s, vm_id=vm_id)
                if vm.status != VmStatus.PENDING or self.hostd is None:
                    return vm
                host = host_repo.get_host(session=s, name=vm.host) if vm.host else None
                vm.status, vm.attempts, vm.updated = VmStatus.CREATING, vm.attempts + 1, self.clock()
                address = host.address if host else ""
            assert vm.allocation is not None and vm.host
            log.info("vm creating vm=%s host=%s attempt=%d", vm.id, vm.host, vm.attempts)
            try:
                got = self.hostd.create(address, create_request(vm, Allocation.from_dict(vm.allocation)))
            except HostdFailed as e:
                self._count("failed")
                failed_hosts.append(vm.host)
                reasons.append(f"{vm.host}: {e.message}")
                log.warning("vm create failed vm=%s host=%s reason=%s", vm.id, vm.host, e.message)
                vm = self._retry_elsewhere(vm, failed_hosts, reasons)
                if vm.status == VmStatus.FAILED:
                    return vm
                continue
            self._count("ok")
            return self._mark_running(vm.id, got)

    def _retry_elsewhere(self, vm: Vm, failed_hosts: list[str], reasons: list[str]) -> Vm:
        with self.store.write() as s:
            row = vm_repo.get_vm(session=s, vm_id=vm.id)
            self.placer.release(s, row)
            row.host, row.status, row.updated = None, VmStatus.PENDING, self.clock()
            if len(failed_hosts) >= self.max_attempts:
                row.status, row.reason = VmStatus.FAILED, "; ".join(reasons)
                return row
            body = create_body(row.request)
            replaces = row.replaces or ""

        def write_vm(s: Session, host: str, alloc: Allocation) -> Vm:
            r = vm_repo.get_vm(session=s, vm_id=vm.id)
            r.host, r.allocation, r.updated = host, alloc.to_dict(), self.clock()
            return r
        try:
            return self.placer.claim(want_of(body, self.default_policy), affinity_of(body, replaces=replaces),
                                     write_vm, exclude=frozenset(failed_hosts))
        except (NoValidHost, Exception) as e:  # nowhere else: the VM fails with every reason
            with self.store.write() as s:
                r = vm_repo.get_vm(session=s, vm_id=vm.id)
                r.status = VmStatus.FAILED
                r.reason = "; ".join(reasons + [f"no other host: {getattr(e, 'message', e)}"])
                r.updated = self.clock()
                log.warning("vm failed vm=%s reason=%s", r.id, r.reason)
                return r

    def _mark_running(self, vm_id: str, got: pb.VM) -> Vm:
        """hostd is the truth: adopt the CPUs it actually pinned (it may pick others on the node)."""
        with self.store.write() as s:
            vm = vm_repo.get_vm(session=s, vm_id=vm_id)
            vm.status, vm.hostd_vm_id, vm.reason, vm.updated = VmStatus.RUNNING, got.vm_id, "", self.clock()
            if vm.allocation and list(got.vcpu_pins) and list(got.vcpu_pins) != vm.allocation["cpus"]:
                self.adopt_cpus(s, vm, list(got.vcpu_pins))
            log.info("vm running vm=%s host=%s hostd_vm=%s", vm.id, vm.host, got.vm_id)
            return vm

    def adopt_cpus(self, s: Session, vm: Vm, pins: list[int]) -> None:
        assert vm.allocation is not None and vm.host
        old = Allocation.from_dict(vm.allocation)
        new = replace(old, cpus=tuple(pins))
        h = host_repo.get_host(session=s, name=vm.host, lock=True)
        usage = Usage.from_dict(h.usage).minus(old)
        if set(pins) & usage.cpus:
            log.error("drift vm=%s host=%s: hostd pinned %s, already claimed centrally", vm.id, vm.host, pins)
        host_repo.bump_usage(session=s, name=h.name, seen_generation=h.generation, usage=usage.plus(new),
                             now=self.clock())
        vm.allocation = new.to_dict()
        log.info("vm cpus adopted from hostd vm=%s %s -> %s", vm.id, list(old.cpus), pins)

    def _count(self, outcome: str) -> None:
        if self.metrics:
            self.metrics.dispatch.labels(outcome).inc()

    # ------------------------------------------------------------ delete / io

    def delete(self, vm_id: str, *, tenant: str | None, actor: str, successor: str = "") -> None:
        """hostd first (HostdFailed: nothing changes here), then the claim is released and
        the record goes. ``successor``: the VM that replaces this one (a drain's
        replacement), which stops naming it in the same transaction."""
        with self.store.read() as s:
            vm = vm_repo.get_vm(session=s, vm_id=vm_id, tenant=tenant)
            address = host_repo.get_host(session=s, name=vm.host).address if vm.host else ""
        if vm.status == VmStatus.CREATING:
            raise VmBusy("the VM is being created; retry when it is running or failed", field="vm_id")
        not_moving(vm)
        if vm.hostd_vm_id and self.hostd is not None:
            self.hostd.delete(address, vm.hostd_vm_id)  # HostdFailed -> 502, nothing released
        with self.store.write() as s:
            row = vm_repo.get_vm(session=s, vm_id=vm_id)
            self.placer.release(s, row)
            s.delete(row)
            if successor:
                vm_repo.clear_replaces(session=s, vm_id=successor, old=vm_id)
            audit_repo.record(session=s, principal=actor, action="vm.delete", target=vm_id, now=self.clock(),
                              detail={"tenant": vm.tenant, "host": vm.host})
        log.info("vm deleted vm=%s host=%s", vm_id, vm.host)

    def stop(self, vm_id: str, *, actor: str, reason: str, grace_seconds: int = 30,
             expect: str = VmStatus.RUNNING) -> Vm:
        """Shut a VM down for good (hostd deletes it, giving the guest ``grace_seconds``
        to power off) and keep its record as ``stopped`` with its request and the host it
        ran on; its resources are freed. ``expect``: the status it must have (a drain
        marks it ``deleting`` first). HostdFailed: nothing changed here."""
        with self.store.read() as s:
            vm = vm_repo.get_vm(session=s, vm_id=vm_id)
            address = host_repo.get_host(session=s, name=vm.host).address if vm.host else ""
        if vm.status != expect:
            raise VmBusy(f"the VM is {vm.status}, not {expect}", field="vm_id")
        not_moving(vm)
        if vm.hostd_vm_id and self.hostd is not None:
            self.hostd.delete(address, vm.hostd_vm_id, grace_seconds=grace_seconds)
        with self.store.write() as s:
            row = vm_repo.get_vm(session=s, vm_id=vm_id)
            self.placer.release(s, row)
            row.status, row.reason, row.hostd_vm_id, row.updated = VmStatus.STOPPED, reason, "", self.clock()
            audit_repo.record(session=s, principal=actor, action="vm.stop", target=vm_id, now=self.clock(),
                              detail={"tenant": row.tenant, "host": row.host, "reason": reason})
        log.info("vm stopped vm=%s host=%s: %s", vm_id, vm.host, reason)
        return row

    def start(self, vm_id: str, *, tenant: str | None, actor: str) -> tuple[Vm, bool]:
        """A ``stopped`` VM (a drain's ``on_maintenance = "stop"``) placed again from its
        own request, on whichever host fits it now, and left ``pending`` for the dispatch:
        the same id, name and Idempotency-Key. Returns (vm, started): a VM pending,
        creating or running already is answered as it is, so a retried start starts
        nothing twice. NoValidHost: nothing changed, it stays stopped. VmBusy: a VM
        failed or being deleted (only a stopped VM starts)."""
        with self.store.read() as s:
            vm = vm_repo.get_vm(session=s, vm_id=vm_id, tenant=tenant)
        if vm.status != VmStatus.STOPPED:
            return self._not_started(vm), False
        body = create_body(vm.request)

        def write_vm(s: Session, host: str, alloc: Allocation) -> Vm:
            r = vm_repo.get_vm(session=s, vm_id=vm_id)
            if r.status != VmStatus.STOPPED:  # another start won: this claim rolls back
                raise _StartedMeanwhile()
            now = self.clock()
            r.host, r.allocation, r.status, r.reason, r.attempts, r.updated = (
                host, alloc.to_dict(), VmStatus.PENDING, "", 0, now)
            audit_repo.record(session=s, principal=actor, action="vm.start", target=vm_id, now=now,
                              detail={"tenant": r.tenant, "host": host, "nodes": list(alloc.nodes),
                                      "cpus": list(alloc.cpus)})
            return r
        try:
            got = self.placer.claim(want_of(body, self.default_policy), affinity_of(body), write_vm)
        except _StartedMeanwhile:
            with self.store.read() as s:
                return self._not_started(vm_repo.get_vm(session=s, vm_id=vm_id)), False
        log.info("vm started vm=%s host=%s cpus=%s", vm_id, got.host, got.allocation["cpus"] if got.allocation else [])
        return got, True

    @staticmethod
    def _not_started(vm: Vm) -> Vm:
        """A start of a VM that is not stopped: itself when it is on its way to running or
        runs, else VmBusy naming what it is."""
        if vm.status in LIVE:
            return vm
        raise VmBusy(f"the VM is {vm.status}; only a stopped VM starts", field="vm_id")

    def mark_stopping(self, vm_id: str, *, reason: str) -> bool:
        """Mark a running VM ``deleting`` with ``reason``, before ``stop(expect="deleting")``
        (a drain's stop counts against the VM's group from this moment); a VM found
        ``deleting`` (a stop under way when a scheduler stopped) is marked again. False:
        the VM is neither running nor deleting."""
        with self.store.write() as s:
            return vm_repo.set_status(session=s, vm_id=vm_id, expect=(VmStatus.RUNNING, VmStatus.DELETING),
                                      status=VmStatus.DELETING, reason=reason, now=self.clock())

    def unmark_stopping(self, vm_id: str) -> None:
        """A stop that did not happen (hostd refused): a VM still ``deleting`` runs again,
        with no reason (its group's budget given back)."""
        with self.store.write() as s:
            vm_repo.set_status(session=s, vm_id=vm_id, expect=(VmStatus.DELETING,), status=VmStatus.RUNNING,
                               reason="", now=self.clock())

    def note(self, vm_id: str, note: str, *, prefix: str) -> None:
        """Set (or clear, with "") a note of one kind in the VM's ``reason`` (the drain's
        "no host for its replacement"): it replaces an empty reason or a note that starts
        with ``prefix``, never another reason (a host's silence flag)."""
        with self.store.write() as s:
            vm_repo.set_note(session=s, vm_id=vm_id, note=note, prefix=prefix)

    def update_io(self, vm_id: str, disks: list[tuple[str, IoTuneIn]], *, tenant: str | None,
                  actor: str, vfs: list[tuple[int, int, int]] | None = None) -> Vm:
        """Live disk throttles and VF tx rates ((position in placement.vfs, max, min)).
        Every field is checked first (InvalidRequest names it; nothing changes). A VF
        min-rate change is reserved from the PF's tx budget before hostd is asked, and
        given back if hostd refuses; disk limits are recorded after hostd applied them."""
        vfs = vfs or []
        if not disks and not vfs:
            raise InvalidRequest("give disks or vfs to change", field="disks")
        for i, (_, tune) in enumerate(disks):
            bad = bounds.iotune_problem(tune.model_dump())
            if bad:
                raise InvalidRequest(bad[1], field=f"disks[{i}].iotune.{bad[0]}")
        with self.store.read() as s:
            vm = vm_repo.get_vm(session=s, vm_id=vm_id, tenant=tenant)
            if not vm.host or not vm.allocation:
                raise VmBusy(f"the VM is {vm.status} and holds no disks or VFs", field="vm_id")
            not_moving(vm)
            h = host_repo.get_host(session=s, name=vm.host)
            res = self.placer.cache.res(s, h)
        alloc = Allocation.from_dict(vm.allocation)
        changes = self._disk_changes(alloc, res, disks)
        rates, fields = self._vf_changes(alloc, res, vfs)
        old = alloc
        if rates:
            self._reserve_vf_rates(vm_id, rates, fields)
        if vm.status == VmStatus.RUNNING and vm.hostd_vm_id and self.hostd is not None:
            try:
                self.hostd.update_io(h.address, vm.hostd_vm_id,
                                     [pb.DiskRequest(disk=n, iotune=pb.IoTune(**t.model_dump()))
                                      for n, t in changes.items()],
                                     [pb.VfRateUpdate(vf_pci=f"{alloc.vfs[i].pf}:{alloc.vfs[i].index}",
                                                      max_tx_rate_mbps=mx, min_tx_rate_mbps=mn)
                                      for i, (mx, mn) in rates.items()])
            except Exception:
                if rates:
                    self._reserve_vf_rates(vm_id, {i: (v.max_tx_rate_mbps, v.min_tx_rate_mbps)
                                                   for i, v in enumerate(old.vfs) if i in rates}, None)
                raise
        with self.store.write() as s:
            row = vm_repo.get_vm(session=s, vm_id=vm_id)
            a = Allocation.from_dict(row.allocation or {})
            row.allocation = replace(a, disks=tuple(
                DiskAlloc(d.name, changes[d.name].bytes_sec(), changes[d.name].iops()) if d.name in changes
                else d for d in a.disks)).to_dict()
            req = json.loads(json.dumps(row.request))
            for d, ad in zip(req.get("disks", []), a.disks):
                if ad.name in changes:
                    d["iotune"] = changes[ad.name].model_dump()
            for i, v in enumerate(req.get("vfs", [])):
                if i in rates:
                    v["max_tx_rate_mbps"], v["min_tx_rate_mbps"] = rates[i]
            row.request, row.updated = req, self.clock()
            audit_repo.record(session=s, principal=actor, action="vm.update_io", target=vm_id, now=self.clock(),
                              detail={"tenant": row.tenant, **{n: t.model_dump() for n, t in changes.items()},
                                      **{f"vfs[{i}]": {"max_tx_rate_mbps": mx, "min_tx_rate_mbps": mn}
                                         for i, (mx, mn) in rates.items()}})
            return row

    @staticmethod
    def _disk_changes(alloc: Allocation, res: Any, disks: list[tuple[str, IoTuneIn]]) -> dict[str, IoTuneIn]:
        mine = {d.name: d for d in alloc.disks}
        budgets = {d.name: d for d in res.disks} | {d.id: d for d in res.disks if d.id}
        changes: dict[str, IoTuneIn] = {}
        for i, (ref, tune) in enumerate(disks):
            b = budgets.get(ref)
            if b is None or b.name not in mine:
                raise InvalidRequest(f"{ref!r} is not a disk of this VM ({', '.join(mine) or 'none'})",
                                     field=f"disks[{i}].disk")
            if b.bytes_sec and not 0 < tune.bytes_sec() <= b.bytes_sec:
                raise InvalidRequest(f"must be 1..{b.bytes_sec} ({b.name}'s budget)",
                                     field=f"disks[{i}].iotune.total_bytes_sec")
            if b.iops and tune.iops() > b.iops:
                raise InvalidRequest(f"must be at most {b.iops} ({b.name}'s budget)",
                                     field=f"disks[{i}].iotune.total_iops_sec")
            changes[b.name] = tune
        return changes

    @staticmethod
    def _vf_changes(alloc: Allocation, res: Any, vfs: list[tuple[int, int, int]]
                    ) -> tuple[dict[int, tuple[int, int]], dict[int, str]]:
        """Position in ``alloc.vfs`` -> (max, min), each checked against its PF (the tx
        budget is checked where it is reserved, against fresh usage), and -> its field."""
        pfs = {p.name: p for p in res.pfs}
        out: dict[int, tuple[int, int]] = {}
        fields: dict[int, str] = {}
        for i, (pos, mx, mn) in enumerate(vfs):
            if pos >= len(alloc.vfs):
                raise InvalidRequest(f"the VM has {len(alloc.vfs)} VF(s)", field=f"vfs[{i}].vf")
            if pos in out:
                raise InvalidRequest("this VF is listed twice", field=f"vfs[{i}].vf")
            pf = pfs.get(alloc.vfs[pos].pf)
            if pf is not None and mx > pf.bandwidth_mbps:
                raise InvalidRequest(f"above {pf.name}'s {pf.bandwidth_mbps} Mbit/s",
                                     field=f"vfs[{i}].max_tx_rate_mbps")
            if mx and mn > mx:
                raise InvalidRequest("exceeds max_tx_rate_mbps", field=f"vfs[{i}].min_tx_rate_mbps")
            if mn and pf is not None and not pf.min_rate_supported:
                raise InvalidRequest(f"{pf.name} cannot guarantee a min tx rate", field=f"vfs[{i}].min_tx_rate_mbps")
            out[pos] = (mx, mn)
            fields[pos] = f"vfs[{i}].min_tx_rate_mbps"
        return out, fields

    def _reserve_vf_rates(self, vm_id: str, rates: dict[int, tuple[int, int]], fields: dict[int, str] | None) -> None:
        """Set the VM's VF rates in its allocation and the host's reserved tx budget, in
        one transaction under the host generation; InvalidRequest (naming ``fields``) if a
        PF would go over. ``fields=None``: putting old rates back, no budget check."""
        for _ in range(self.placer.retries):
            with self.store.write() as s:
                row = vm_repo.get_vm(session=s, vm_id=vm_id)
                h = host_repo.get_host(session=s, name=row.host, lock=True)
                res = self.placer.cache.res(s, h)
                old = Allocation.from_dict(row.allocation or {})
                new = replace(old, vfs=tuple(
                    VfAlloc(v.pf, v.index, *rates[i]) if i in rates else v for i, v in enumerate(old.vfs)))
                usage = Usage.from_dict(h.usage).minus(old).plus(new)
                for p in res.pfs if fields is not None else ():
                    if usage.reserved_mbps.get(p.name, 0) > p.bandwidth_mbps:
                        pos = next(k for k in sorted(rates) if old.vfs[k].pf == p.name)
                        left = p.bandwidth_mbps - Usage.from_dict(h.usage).minus(old).reserved_mbps.get(p.name, 0)
                        raise InvalidRequest(f"{p.name} has {left} Mbit/s of min-rate budget left for this VM",
                                             field=fields[pos])
                if host_repo.bump_usage(session=s, name=h.name, seen_generation=h.generation, usage=usage,
                                        now=self.clock()):
                    row.allocation = new.to_dict()
                    return
        raise ConcurrentUpdate(f"could not reserve VF rates of {vm_id}: the host kept changing")
