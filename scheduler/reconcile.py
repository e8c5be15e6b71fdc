"""Periodic reconcile against hostd (hostd is the truth for what runs).

Per reachable host: ListVMs, then
- a VM the scheduler thinks is running/creating (older than the grace period) that
  hostd does not have: failed ("vanished"), claim released;
- a hostd VM carrying our ``hyb.vm`` label that the scheduler shows pending/creating/failed:
  running, with hostd's vm id and CPUs (one it is deleting, a drain's stop, stays so);
- a hostd VM with our label and no scheduler row (deleted here, still running there):
  adopted as a running VM of its tenant with hostd's placement, so its resources count;
- a running VM whose CPUs differ from hostd's pins: hostd's pins adopted;
- a VM moving live (``migration_state`` set) is left alone on both hosts: the migration
  service (scheduler/service/migrations.py) asks both hostds where it runs and settles it;
finally the host's usage is recomputed from its live allocations and the target claims
of the VMs moving to it (the ledger equals the sum of allocations). Every repair is
logged and counted."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

from api import hostd_pb2 as pb
from api.states import VmStatus
from scheduler.config import ReconcileConfig
from scheduler.db.models import LIVE, Vm
from scheduler.errors import SchedulerError
from scheduler.repo import hosts as host_repo
from scheduler.repo import vms as vm_repo
from scheduler.resources import Allocation, DiskAlloc, Usage, VfAlloc

log = logging.getLogger(__name__)


def reconcile_host(app: Any, hostd: Any, name: str, *, grace_s: float) -> list[str]:
    """Repair one host; returns the repairs made ("kind vm=..")."""
    store, placer = app.state.store, app.state.placer
    clock = placer.clock
    with store.read() as s:
        h = host_repo.get_host(session=s, name=name)
        address = h.address
    remote = {v.labels.get("hyb.vm"): v for v in hostd.list_vms(address) if v.labels.get("hyb.vm")}
    repairs: list[str] = []
    now = clock()
    with store.write() as s:
        h = host_repo.get_host(session=s, name=name, lock=True)
        rows = {v.id: v for v in vm_repo.list_vms(session=s, host=name, limit=100000)}
        for vm_id, v in rows.items():
            got = remote.get(vm_id)
            if v.migration_state:  # the migration service settles it
                continue
            if got is None:
                if _live(v) and (v.status == VmStatus.RUNNING or now - v.updated > grace_s):
                    v.status, v.reason, v.allocation, v.updated = VmStatus.FAILED, "vanished from hostd", None, now
                    repairs.append(f"vanished vm={vm_id}")
                continue
            if got.state == pb.VM_STATE_FAILED and v.status != VmStatus.FAILED:
                v.status, v.reason, v.allocation, v.updated = VmStatus.FAILED, got.reason or "failed on hostd", None, now
                repairs.append(f"failed vm={vm_id}")
                continue
            if got.state in (pb.VM_STATE_RUNNING, pb.VM_STATE_STOPPED) and \
                    v.status not in (VmStatus.RUNNING, VmStatus.DELETING):
                v.status, v.hostd_vm_id, v.reason, v.updated = VmStatus.RUNNING, got.vm_id, "", now
                if v.allocation is None:
                    v.allocation = alloc_of(got).to_dict()
                repairs.append(f"adopted_state vm={vm_id}")
            if v.allocation and list(got.vcpu_pins) and list(got.vcpu_pins) != v.allocation["cpus"]:
                a = Allocation.from_dict(v.allocation)
                v.allocation = replace(a, cpus=tuple(got.vcpu_pins)).to_dict()
                repairs.append(f"cpus vm={vm_id}")
        for vm_id, got in remote.items():
            if vm_id in rows or got.state in (pb.VM_STATE_FAILED, pb.VM_STATE_DELETING):
                continue
            other = s.get(Vm, vm_id)
            if other is not None and other.migration_host == name:  # moving here: the migration settles it
                continue
            if other is not None:  # on another host here: hostd is the truth for where it runs
                log.error("drift vm=%s: scheduler says host=%s, hostd %s runs it", vm_id, other.host, name)
                repairs.append(f"misplaced vm={vm_id}")
                continue
            s.add(_adopted(vm_id, got, name, now))
            repairs.append(f"orphan_adopted vm={vm_id}")
        s.flush()
        live = [Allocation.from_dict(v.allocation) for v in vm_repo.live_on_host(session=s, host=name)
                if v.allocation]
        live += [Allocation.from_dict(v.migration_allocation)
                 for v in vm_repo.incoming_on_host(session=s, host=name) if v.migration_allocation]
        truth = Usage.of(live)
        if truth.to_dict() != h.usage:
            host_repo.bump_usage(session=s, name=name, seen_generation=h.generation, usage=truth, now=now)
            repairs.append("usage_recomputed")
    for r in repairs:
        log.warning("reconcile repair host=%s %s", name, r)
        if app.state.metrics:
            app.state.metrics.reconcile_repairs.labels(r.split()[0]).inc()
    return repairs


def _live(v: Vm) -> bool:
    return v.status in LIVE


def alloc_of(got: pb.VM) -> Allocation:
    """What a VM hostd runs holds, from its report (guest cells when it spans nodes)."""
    size = got.hugepage_size_kb or 2048
    cells = [(c.numa_node, tuple(c.cpus), c.memory_mib * 1024 // size) for c in got.cells] or \
        [(got.numa_node, tuple(got.vcpu_pins), got.memory_mib * 1024 // size)]
    return Allocation(tuple(n for n, _, _ in cells), tuple(c for _, cpus, _ in cells for c in cpus),
                      tuple((n, size, p) for n, _, p in cells),
                      tuple(VfAlloc(v.pf, v.index, v.max_tx_rate_mbps, v.min_tx_rate_mbps) for v in got.vfs),
                      tuple(DiskAlloc(d.disk, d.iotune.total_bytes_sec, d.iotune.total_iops_sec) for d in got.disks),
                      tuple(len(cpus) for _, cpus, _ in cells) if len(cells) > 1 else ())


def _adopted(vm_id: str, got: pb.VM, host: str, now: float) -> Vm:
    tenant = got.labels.get("hyb.tenant", "default")
    name = got.labels.get("hyb.name", got.name[:48])
    req = {"name": name, "vcpus": max(1, len(got.vcpu_pins)), "memory_mib": max(2, got.memory_mib),
           "page_size_kb": got.hugepage_size_kb or 2048, "image": got.image or "unknown",
           "allow_span_nodes": len(got.cells) > 1,
           "labels": {k: v for k, v in got.labels.items() if not k.startswith("hyb.")}, "tenant": tenant}
    return Vm(id=vm_id, tenant=tenant, name=name, idempotency_key=f"adopted:{vm_id}", request_hash="",
              request=req, host=host, allocation=alloc_of(got).to_dict(), status=VmStatus.RUNNING,
              reason="adopted from hostd by reconcile", hostd_vm_id=got.vm_id, affinity_group="", attempts=0,
              replaces=None, disruption_group="", created=now, updated=now)


def reconcile_all(app: Any, hostd: Any, cfg: ReconcileConfig) -> dict[str, list[str]]:
    with app.state.store.read() as s:
        names = [h.name for h in host_repo.list_hosts(session=s)]
    out: dict[str, list[str]] = {}
    for name in names:
        try:
            out[name] = reconcile_host(app, hostd, name, grace_s=cfg.grace_s)
        except SchedulerError as e:  # unreachable hostd: the heartbeat marks it down; try next round
            log.warning("reconcile skipped host=%s: %s", name, e)
    return out


class _Loop:
    def __init__(self, app: Any, hostd: Any, cfg: ReconcileConfig):
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(app, hostd, cfg), name="reconcile", daemon=True)
        self._t.start()

    def _run(self, app: Any, hostd: Any, cfg: ReconcileConfig) -> None:
        while not self._stop.wait(cfg.interval_s):
            t = time.monotonic()
            try:
                got = reconcile_all(app, hostd, cfg)
            except Exception:  # noqa: BLE001 - the loop must survive a bad round
                log.exception("reconcile round failed")
                continue
            log.info("reconcile round hosts=%d repairs=%d took_s=%.3f", len(got),
                     sum(len(v) for v in got.values()), time.monotonic() - t)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(5)


def start_reconciler(app: Any, hostd: Any, cfg: ReconcileConfig) -> _Loop:
    return _Loop(app, hostd, cfg)
