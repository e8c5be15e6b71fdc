"""Drains that move VMs: the scheduler's side of ``POST /v1/hosts/{name}/drain``.

Every ``drain.interval_s`` (and at once after a drain is asked for), one round: the VMs
on draining hosts, the VMs of their disruption groups anywhere in the fleet and the
replacements under way are read, ``scheduler.drain_plan.plan`` says per VM what may happen
now, and the round acts on it:

- ``replace``: a new VM from the old one's request (same tenant, name and spec; the
  Idempotency-Key ``drain:<old id>``, so a repeated round or a second replica gets the
  same replacement, never a second one), claimed through the usual placement (a
  draining or cordoned host gets none), then dispatched to its hostd in the background.
  When placement refuses it, the old VM's reason says so, with when and placement's
  answer (``GET /v1/vms/{id}``, and beside the step in the drain view), until a round
  places it;
- ``delete_old``: the replacement runs, so the old VM is deleted (hostd first, then its
  claim) and the replacement stops naming it;
- ``stop``: the VM is marked ``deleting`` (so it counts against its group's budget from
  that moment), hostd shuts it down, and its record stays as ``stopped``; a VM found
  ``deleting`` (a scheduler stopped in the middle) is stopped again (hostd's delete is
  idempotent);
- ``migrate``: the VM's live move is started (``MigrationService.start``: the target
  claimed through placement, the move recorded) and driven in the background
  (``MigrationService.run``); the VM counts against its group's budget until it runs on
  the target. A move that could not start, or failed (the VM runs where it was), is named
  in the VM's reason and tried again next round. Each round first takes over moves a
  stopped scheduler left (``MigrationService.resume``);
- ``wait``: nothing; ``GET /v1/hosts/{name}/drain`` shows what it waits for.

A step that fails is logged and tried again next round; so is a replacement that
failed (its hostd down, no other host took it): ``retry`` deletes it, and the next round
creates it again (the same Idempotency-Key, free again), so a drain does not stall on a
hostd that was down and came back. A replacement a stopped scheduler left ``pending`` or
``creating`` is dispatched again (``VmService.redispatch``; hostd's CreateVM is
idempotent by request id): at once on SQLite, after ``orphan_after_s`` on PostgreSQL. Rounds on PostgreSQL hold an advisory
lock, so with several replicas one plans at a time and a budget is never spent twice;
SQLite has one scheduler process.

A round reads through the repos and changes a VM only through ``VmService`` (create,
dispatch, delete, mark stopping, stop, the note in its reason), the one owner of a VM's
status: the drain holds no query of its own (tests/scheduler/service/test_sched_drain_layering.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from api.states import AdminState, DrainAction, OnMaintenance, VmStatus
from scheduler.db.engine import Store
from scheduler.db.models import Host, Vm
from scheduler.drain_plan import MOVE_NOTE, NOT_MOVED, NOT_PLACED, DrainVm, Step, plan
from scheduler.errors import SchedulerError
from scheduler.repo import hosts as host_repo
from scheduler.repo import pg
from scheduler.repo import vms as vm_repo
from scheduler.schemas.hosts import DrainPublic, DrainStepOut
from scheduler.service.vms import VmService, create_body, migration_public

log = logging.getLogger(__name__)

# The round's lock on PostgreSQL (session-level, tried, never waited for); outside the
# int4 range of the anti-affinity group locks, unlike the claim and rollout keys.
ROUND_LOCK_KEY = int.from_bytes(b"HYBDRAIN", "big")


def drain_vm(v: Vm, budgets: dict[str, int]) -> DrainVm:
    """The planner's view of a VM row. ``budgets``: per (tenant/group), the smallest
    ``max_unavailable`` its VMs give."""
    req = v.request or {}
    group = f"{v.tenant}/{v.disruption_group}" if v.disruption_group else ""
    return DrainVm(v.id, v.name, v.host, v.status, req.get("on_maintenance") or OnMaintenance.BLOCK, group,
                   budgets.get(group, 0), v.replaces or "", v.reason or "",
                   (v.migration_host or "") if v.migration_state else "")


def load(s: Any, hosts: Collection[str]) -> list[DrainVm]:
    """What ``plan`` needs for ``hosts``: their VMs, every VM of those VMs' groups, and the
    replacements of those VMs."""
    return [d for d, _ in load_rows(s, hosts)]


def load_rows(s: Any, hosts: Collection[str]) -> list[tuple[DrainVm, Vm]]:
    """``load``, each with its row (what a step acts on: the tenant, the request)."""
    on, more = vm_repo.drain_rows(session=s, hosts=hosts)
    rows = on + more
    tenants = {v.tenant for v in on if v.disruption_group}
    budgets: dict[str, int] = {}
    for v in rows:
        b = (v.request or {}).get("disruption_budget")
        if v.disruption_group and b and v.tenant in tenants:
            key = f"{v.tenant}/{v.disruption_group}"
            budgets[key] = min(budgets.get(key, b["max_unavailable"]), b["max_unavailable"])
    return [(drain_vm(v, budgets), v) for v in rows]


class DrainService:
    def __init__(self, *, store: Store, vms: VmService, clock: Callable[[], float] = time.time,
                 workers: int = 4, stop_grace_s: int = 30, migrations: Any = None, orphan_after_s: float = 360.0):
        self.store = store
        self.vms = vms
        self.migrations = migrations  # service/migrations.py MigrationService: a ``migrate`` step's
        # a replacement pending or creating this long, dispatched by no one here, is
        # dispatched again (PostgreSQL; SQLite, one process: at once)
        self.orphan_after_s = orphan_after_s
        self.clock = clock
        self.stop_grace_s = stop_grace_s
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="drain")
        self._busy: set[str] = set()  # VMs with a step under way in this process
        self._busy_lock = threading.Lock()
        self.wake = threading.Event()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------ read

    def plan_for(self, host: str) -> tuple[Host, list[Step]]:
        """The host and what its drain would do now (read only)."""
        with self.store.read() as s:
            h = host_repo.get_host(session=s, name=host)
            return h, plan({host}, load(s, [host]))

    def status(self, host: str) -> DrainPublic:
        """``plan_for`` as the API answers it: per VM, what the drain does or waits for,
        and a VM moving live with its move's progress (as the VM shows it)."""
        now = self.clock()
        with self.store.read() as s:
            h = host_repo.get_host(session=s, name=host)
            rows = load_rows(s, [host])
            steps = plan({host}, [d for d, _ in rows])
            moving = {v.id: migration_public(v, now) for _, v in rows if v.migration_state}
            name, admin = h.name, h.admin_state
        left = sum(st.action != DrainAction.DONE for st in steps)
        return DrainPublic(host=name, admin_state=admin, drained=admin == AdminState.DRAINING and not left,
                           left=left, steps=[DrainStepOut(**st.__dict__, migration=moving.get(st.vm))
                                             for st in steps])

    # ------------------------------------------------------------ act

    def round(self) -> dict[str, list[Step]]:
        """One pass over every draining host; returns the plan it acted on, per host."""
        if self.store.sqlite:
            return self._round()
        with pg.session_lock(self.store.engine, ROUND_LOCK_KEY) as held:
            return self._round() if held else {}  # not held: another replica is planning

    def _round(self) -> dict[str, list[Step]]:
        if self.migrations is not None:  # moves a stopped scheduler left: settled first
            try:
                self.migrations.resume()
            except Exception:  # noqa: BLE001 - the drains go on
                log.exception("resuming live moves failed")
        with self.store.read() as s:
            hosts = host_repo.names_in_state(session=s, state=AdminState.DRAINING)
            if not hosts:
                return {}
            loaded = load_rows(s, hosts)
            vms = [d for d, _ in loaded]
            rows = {v.id: (v.tenant, dict(v.request or {}), v.host, v.reason or "") for _, v in loaded}
            now = self.clock()
            orphans = [v.id for d, v in loaded
                       if d.replaces and self.vms.orphaned(v, now=now, after_s=self.orphan_after_s)]
        for vm_id in orphans:  # a scheduler stopped mid-dispatch: its replacement would hold the group
            with self._busy_lock:
                if vm_id in self._busy:
                    continue
                self._busy.add(vm_id)
            log.warning("drain: replacement vm=%s was left pending or creating; dispatching it again", vm_id)
            self._pool.submit(self._background, vm_id, self.vms.redispatch, vm_id)
        steps = plan(set(hosts), vms)
        by_host: dict[str, list[Step]] = {h: [] for h in hosts}
        where = {v.id: v.host for v in vms}
        for st in steps:
            by_host.setdefault(where.get(st.vm) or "", []).append(st)
            if st.action in (DrainAction.WAIT, DrainAction.DONE):
                continue
            with self._busy_lock:
                if st.vm in self._busy:
                    continue
                self._busy.add(st.vm)
            try:
                self._act(st, rows[st.vm], vms)
            except SchedulerError as e:
                log.warning("drain %s vm=%s (%s) failed, next round tries again: %s", st.action, st.vm, st.name, e)
                self._done(st.vm)
            except Exception:  # noqa: BLE001 - one VM's step must not stop the round
                log.exception("drain %s vm=%s failed", st.action, st.vm)
                self._done(st.vm)
        return by_host

    def _done(self, vm_id: str) -> None:
        with self._busy_lock:
            self._busy.discard(vm_id)

    def _act(self, st: Step, row: tuple[str, dict[str, Any], str | None, str], vms: list[DrainVm]) -> None:
        tenant, req, host, reason = row
        actor = f"drain:{host}"
        if st.action == DrainAction.REPLACE:
            body = create_body(req)
            item = self.vms.prepare(body, tenant=tenant, key=f"drain:{st.vm}", actor=actor, replaces=st.vm)
            got = self.vms.create_many([item])[0]  # claimed now: the next round sees it
            if isinstance(got, BaseException):
                if isinstance(got, SchedulerError):
                    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
                    self.vms.note(st.vm, f"{NOT_PLACED} (tried {at}, again every round): {got.message}",
                                  prefix=NOT_PLACED)
                raise got
            if reason.startswith(NOT_PLACED):  # placed now: the note goes (no write when there was none)
                self.vms.note(st.vm, "", prefix=NOT_PLACED)
            new, _ = got
            log.info("drain replace vm=%s (%s) on %s: replacement %s on %s", st.vm, st.name, host, new.id, new.host)
            self._pool.submit(self._background, st.vm, self.vms.dispatch, new.id)
        elif st.action == DrainAction.MIGRATE:
            if self.migrations is None:
                return self._done(st.vm)
            try:  # the budget was the planner's: claimed on a target now, the next round sees it moving
                self.migrations.start(st.vm, target=None, actor=actor, check_budget=False)
            except SchedulerError as e:
                at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
                self.vms.note(st.vm, f"{NOT_MOVED}: no move started (tried {at}, again every round): {e.message}",
                              prefix=MOVE_NOTE)
                raise
            self.migrations.submit(st.vm)
            log.info("drain migrate vm=%s (%s) from %s", st.vm, st.name, host)
            self._done(st.vm)  # the migration service drives it from here
        elif st.action == DrainAction.RETRY:  # the failed replacement goes; the next round replaces again
            new = next(v for v in vms if v.replaces == st.vm)
            self._pool.submit(self._background, st.vm, self._delete_failed, new.id, actor)
        elif st.action == DrainAction.DELETE_OLD:
            new = next(v for v in vms if v.replaces == st.vm)
            self._pool.submit(self._background, st.vm, self._delete_old, st.vm, new.id, actor)
        elif st.action == DrainAction.STOP:  # from running, or again after a restart in the middle (deleting)
            # counts against the group's budget from now on
            if not self.vms.mark_stopping(st.vm, reason=f"stopping for the drain of {host}"):
                return self._done(st.vm)
            self._pool.submit(self._background, st.vm, self._stop, st.vm, host, actor)

    def _background(self, vm_id: str, fn: Callable[..., object], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - logged; the next round sees the state and acts again
            log.exception("drain step for vm=%s failed", vm_id)
        finally:
            self._done(vm_id)
            self.wake.set()

    def _delete_failed(self, new: str, actor: str) -> None:
        self.vms.delete(new, tenant=None, actor=actor)
        log.info("drain deleted failed replacement vm=%s; the next round replaces again", new)

    def _delete_old(self, old: str, new: str, actor: str) -> None:
        self.vms.delete(old, tenant=None, actor=actor, successor=new)
        log.info("drain moved vm=%s -> %s", old, new)

    def _stop(self, vm_id: str, host: str | None, actor: str) -> None:
        try:
            self.vms.stop(vm_id, actor=actor, reason=f"stopped for the drain of {host}",
                          grace_seconds=self.stop_grace_s, expect=VmStatus.DELETING)
        except Exception:
            self.vms.unmark_stopping(vm_id)  # not stopped: running again, the budget given back
            raise


class DrainLoop:
    """The rounds, in a thread: every ``interval_s``, or at once when woken."""

    def __init__(self, svc: DrainService, interval_s: float):
        self.svc = svc
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="drain", daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.svc.wake.wait(self.interval_s)
            self.svc.wake.clear()
            if self._stop.is_set():
                return
            try:
                self.svc.round()
            except Exception:  # noqa: BLE001 - the loop must survive a bad round (a database away)
                log.exception("drain round failed")

    def stop(self) -> None:
        self._stop.set()
        self.svc.wake.set()
        self._t.join(10)
