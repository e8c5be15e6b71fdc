"""The VM lifecycle on one host: claim -> VF rate -> define -> start -> record,
every step undone on failure, idempotent by request id, and reconciled with
libvirt after a restart.

The ledger row is written *before* anything touches the host (state
``creating``), so a hostd killed at any step leaves a row that ``reconcile``
finds and rolls back; a domain is only ever defined with hostd's metadata, so a
domain whose row is lost is found by ``listAllDomains`` and adopted.

``VmManager`` has no gRPC in it: ``hostd/rpc/servicer.py`` maps the API onto it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import signal
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from api.bounds import (
    DISKS_MAX,
    VFS_MAX,
    check_count,
    check_disk_ref,
    check_grace_seconds,
    check_label_selector,
    check_vf_ref,
    check_vm_id,
)
from api.layout import Layout
from hostd.apply.diskhold import DiskHold
from hostd.apply.hostlock import HostLock
from hostd.apply.images import ImageStore
from hostd.apply.ledger import CALL_OWNED, Ledger, VmRecord, VmState
from hostd.apply.libvirt_host import LibvirtHost
from hostd.apply.overlays import Overlays
from hostd.apply.steps import VfRates
from hostd.carve.vmclaim import Claim, claim
from hostd.carve.vmspec import DiskSpec, VmSpec, spec_problem
from hostd.domain.image import Image
from hostd.domain.metadata import VmMetadata
from hostd.errors import (
    BadMetadata,
    Conflict,
    CreateFailed,
    DomainError,
    HostdError,
    MigrationInProgress,
    NoFit,
    NotCarved,
    NotFound,
    Refused,
    SpecInvalid,
    UnknownProfile,
)
from hostd.metrics import Metrics

log = logging.getLogger(__name__)

# Drivers whose VFs accept a min_tx_rate (a guaranteed rate). Many Intel drivers
# (ixgbe, i40e, iavf PFs) answer EINVAL; hostd refuses such a request up front.
MIN_RATE_DRIVERS = frozenset({"mlx5_core", "ice", "bnxt_en", "qede", "netdevsim"})

# Fault injection for the crash tests: HOSTD_CRASH_AT=<point> with HOSTD_TEST_FAULTS=1
# makes hostd SIGKILL itself at that point of CreateVM.
CRASH_POINTS = ("claimed", "vf_set", "defined", "started")
# How long a VM change waits for a carve of this host (the carve lock) to finish.
CARVE_WAIT_S = 120.0


@dataclass(frozen=True)
class VmEvent:
    vm_id: str
    state: str
    reason: str
    time_ns: int


Render = Callable[[VmMetadata, Image], str]
DiskCheck = Callable[[str], list[str]]  # disk name -> reasons it may not be used now
CarvedFor = Callable[[int], str]  # page size kB -> why the host cannot back VM memory with it ("" if it can)


class VmManager:
    def __init__(self, *, layout: Layout, siblings: dict[int, tuple[int, ...]], ledger: Ledger,
                 libvirt: LibvirtHost, images: ImageStore, render: Render,
                 disk_check: DiskCheck, vf_rates: VfRates | None = None,
                 pf_drivers: dict[str, str | None] | None = None,
                 vf_pci: dict[tuple[str, int], str] | None = None,
                 profiles: frozenset[str] | None = None,
                 overlays: Overlays | None = None, metrics: Metrics | None = None,
                 disk_hold: DiskHold | None = None, host_lock: HostLock | None = None,
                 carved_for: CarvedFor | None = None):
        self.layout = layout
        self.siblings = siblings
        self.ledger = ledger
        self.libvirt = libvirt
        self.images = images
        self.render = render
        self.disk_check = disk_check
        self.vf_rates = vf_rates
        self.pf_drivers = pf_drivers or {}
        self.vf_pci = vf_pci if vf_pci is not None else {}  # shared with the renderer: kept, even empty
        self.profiles = profiles  # None: any (no profile store configured)
        self.overlays = overlays  # per-VM files (root disk overlay); None: images boot as they are
        self.metrics = metrics
        self.disk_hold = disk_hold  # O_EXCL on claimed disks from define until QEMU has them
        # The host's carve lock (shared): no VM changes under a carve of another process
        # (`hostd carve`) or thread (the Carve RPC). None: no carve to wait for (tests).
        self.host_lock = host_lock
        self.carved_for = carved_for  # None: no check (libvirt's test driver backs nothing)
        self._lock = threading.RLock()
        # VMs a call works on outside the lock (a guest's shutdown: up to its grace, 300 s
        # at most), vm_id -> what: other VMs' changes go on meanwhile, while a change to
        # one of these waits for the call to end (``_idle``) and reconcile and libvirt's
        # events leave it to the call.
        self._busy: dict[str, str] = {}
        self._quiet = threading.Condition(self._lock)
        self._watchers: list[Callable[[VmEvent], None]] = []
        self.generation = 0
        self._crash_at = os.environ.get("HOSTD_CRASH_AT") if os.environ.get("HOSTD_TEST_FAULTS") == "1" else None

    # ------------------------------------------------------------ the layout

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The manager's lock, for a caller that changes the host under the VMs (the
        carve service, which holds the carve lock already): no VM is created, started,
        changed or deleted meanwhile."""
        with self._lock:
            yield

    @contextlib.contextmanager
    def _changing(self, what: str) -> Iterator[None]:
        """A VM change: the carve lock shared, then the manager's lock (the carve takes
        them in the same order)."""
        shared = self.host_lock.shared(what, wait_s=CARVE_WAIT_S) if self.host_lock else contextlib.nullcontext()
        with shared, self._lock:
            yield

    def _idle(self, vm_id: str) -> bool:
        """Under the lock: wait until no call works on ``vm_id`` outside it (the lock is
        released meanwhile). True if it waited: what the caller read before is stale."""
        waited = False
        while vm_id in self._busy:
            waited = True
            self._quiet.wait()
        return waited

    def set_layout(self, layout: Layout, disk_check: DiskCheck | None = None) -> None:
        """Serve VMs with ``layout`` from now on (after a carve). Every reader of the
        layout runs under the lock or reads ``self.layout`` once, so a call sees the old
        layout or the new one, never a mix."""
        with self._lock:
            self.layout = layout
            if disk_check is not None:
                self.disk_check = disk_check
            self.generation += 1
        log.info("serving VMs with a new layout vm_cpus=%s", list(layout.vm_cpus))

    # ------------------------------------------------------------ events

    def watch(self, fn: Callable[[VmEvent], None]) -> Callable[[], None]:
        with self._lock:
            self._watchers.append(fn)
        return lambda: self._unwatch(fn)

    def _unwatch(self, fn: Callable[[VmEvent], None]) -> None:
        with self._lock:
            if fn in self._watchers:
                self._watchers.remove(fn)

    def emit(self, vm_id: str, state: str, reason: str = "") -> None:
        ev = VmEvent(vm_id, state, reason, time.time_ns())
        for fn in list(self._watchers):
            try:
                fn(ev)
            except Exception:  # a slow or dead watcher must not break the lifecycle
                log.exception("event watcher failed")

    def _crash(self, point: str) -> None:
        if self._crash_at == point:
            log.warning("fault injection: SIGKILL at %s", point)
            os.kill(os.getpid(), signal.SIGKILL)

    # ------------------------------------------------------------ create

    def min_rate_supported(self, pf: str) -> bool:
        return self.pf_drivers.get(pf) in MIN_RATE_DRIVERS

    def create(self, spec: VmSpec) -> VmRecord:
        bad = spec_problem(spec)  # before any lock, lookup or write: a bad request changes nothing
        if bad:
            raise SpecInvalid(bad.reason, field=bad.field)
        with self._changing("create a VM"):
            prior = self.ledger.get(request_id=spec.request_id)
            if prior is not None:
                if not VmSpec.from_dict(prior.spec).same_as(self._with_macs(spec)):
                    raise Conflict("request_id was already used with a different spec", field="request_id")
                return prior
            image = self.admit(spec)
            vm_id = str(uuid.uuid4())
            spec = self._with_macs(spec)
            with self.ledger.tx() as db:
                got = claim(self.layout, self.siblings, self.ledger.usage(db), spec.request())
                if isinstance(got, NoFit):
                    raise Refused(got.reason, field=got.field)
                md = VmMetadata(vm_id, spec.request_id, int(time.time()), got, spec)
                self.ledger.record(db, vm_id=vm_id, request_id=spec.request_id, name=spec.name,
                                   claim=got, spec=spec.to_dict(), state=VmState.CREATING)
            self.generation += 1
            self.emit(vm_id, VmState.CREATING)
            self._crash("claimed")
            try:
                self._set_vf_rates(got, spec)
                self._crash("vf_set")
                booted = self.overlays.prepare(spec.name, image) if self.overlays else image
                held = [(f"disks[{i}].disk", d.name) for i, d in enumerate(got.disks)]
                with self.disk_hold.hold(held) if self.disk_hold else contextlib.nullcontext():
                    self.libvirt.define(spec.name, self.render(md, booted))
                    self._crash("defined")
                    self.libvirt.start(vm_id)
                self._crash("started")
            except Exception as e:
                log.error("create failed vm=%s name=%s error=%s; rolling back", vm_id, spec.name, e)
                self.teardown(vm_id, got, spec.name)
                self.emit(vm_id, VmState.FAILED, str(e))
                if isinstance(e, HostdError):
                    raise
                raise CreateFailed(str(e)) from e
            self.ledger.set_state(vm_id, VmState.RUNNING)
            self.emit(vm_id, VmState.RUNNING)
            log.info("created vm=%s name=%s node=%d cpus=%s", vm_id, spec.name, got.node, got.vcpu_pins)
            rec = self.ledger.get(vm_id=vm_id)
            assert rec is not None
            return rec

    def admit(self, spec: VmSpec) -> Image:
        """The checks of a VM before anything is claimed (CreateVM's, and a migration
        target's: one home): its name is free, its image and profile known here, its
        disks and VFs usable, its page size mounted. Returns the image."""
        if any(r.name == spec.name for r in self.ledger.list()):
            raise Conflict(f"a VM named {spec.name!r} exists", field="name")
        image = self.images.get(spec.image)
        if spec.profile and self.profiles is not None and spec.profile not in self.profiles:
            raise UnknownProfile(f"no tuning profile {spec.profile!r} (known: "
                                 f"{', '.join(sorted(self.profiles)) or 'none'})", field="profile")
        if spec.profile and image.profiles and spec.profile not in image.profiles:
            raise Refused(f"image {image.name} has profiles {list(image.profiles)}", field="profile")
        self._check_spec(spec)
        why = self.carved_for(spec.hugepage_size_kb) if self.carved_for else ""
        if why:
            raise NotCarved(why, field="hugepage_size_kb")
        return image

    def _with_macs(self, spec: VmSpec) -> VmSpec:
        """Fill in a MAC for every VF that has none, derived from the request id so
        a retried request gets the same MAC."""
        vfs = tuple(v if v.mac else dataclasses.replace(v, mac=_mac(spec.request_id, i))
                    for i, v in enumerate(spec.vfs))
        return dataclasses.replace(spec, vfs=vfs)

    def _check_spec(self, spec: VmSpec) -> None:
        names = self._resolve_disks([d.disk for d in spec.disks])
        for i, name in enumerate(names):
            if name is None:
                allowed = ", ".join(b.name for b in self.layout.disks) or "none"
                raise Refused(f"{spec.disks[i].disk!r} is not an assignable disk on this host "
                              f"(assignable: {allowed})", field=f"disks[{i}].disk")
            reasons = self.disk_check(name)
            if reasons:
                raise Refused(f"{name} cannot be used now: {'; '.join(reasons)}", field=f"disks[{i}].disk")
        for i, v in enumerate(spec.vfs):
            if v.min_tx_rate_mbps and v.pf and not self.min_rate_supported(v.pf):
                raise Refused(f"{v.pf} ({self.pf_drivers.get(v.pf) or 'unknown driver'}) does not "
                              "support a minimum VF tx rate", field=f"vfs[{i}].min_tx_rate_mbps")

    def _set_vf_rates(self, c: Claim, spec: VmSpec) -> None:
        for i, v in enumerate(c.vfs):
            if v.min_tx_rate_mbps and not self.min_rate_supported(v.pf):
                raise Refused(f"{v.pf} ({self.pf_drivers.get(v.pf) or 'unknown driver'}) does not "
                              "support a minimum VF tx rate", field=f"vfs[{i}].min_tx_rate_mbps")
            if self.vf_rates is None:
                raise Refused("VF rate limits need netlink, which this hostd has not got",
                              field=f"vfs[{i}]")
            try:
                self.vf_rates.set_rate(v.pf, v.index, v.max_tx_rate_mbps, v.min_tx_rate_mbps)
            except OSError as e:
                raise Refused(f"{v.pf} VF {v.index}: the driver refused tx rate "
                              f"{v.max_tx_rate_mbps}/{v.min_tx_rate_mbps} Mbit/s: {e.strerror or e}",
                              field=f"vfs[{i}]") from None

    def _reset_vf_rates(self, c: Claim) -> None:
        if self.vf_rates is None:
            return
        for v in c.vfs:
            pf = next((p for p in self.layout.pfs if p.name == v.pf), None)
            slot = next((s for s in pf.slots if s.index == v.index), None) if pf else None
            want = (slot.max_tx_rate_mbps, slot.min_tx_rate_mbps) if slot else (0, 0)
            try:
                self.vf_rates.set_rate(v.pf, v.index, *want)
            except OSError as e:
                log.error("cannot reset VF rate pf=%s vf=%d error=%s", v.pf, v.index, e)

    def teardown(self, vm_id: str, c: Claim, name: str) -> None:
        """Undo every side effect of a VM and release its claim; each step runs
        even if an earlier one failed."""
        try:
            self.libvirt.destroy_and_undefine(vm_id)
        except HostdError as e:
            log.error("teardown: domain %s: %s", vm_id, e)
        self._reset_vf_rates(c)
        if self.overlays:
            try:
                self.overlays.release(name)
            except OSError as e:
                log.error("teardown: files of %s: %s", name, e)
        with self.ledger.tx() as db:
            self.ledger.release(db, vm_id)
        self.generation += 1

    # ------------------------------------------------------------ the rest of the lifecycle

    def _resolve_disks(self, refs: list[str]) -> list[str | None]:
        """The kernel name of each disk a request names (by name or by stable id; None:
        not an assignable disk). One device named twice is the caller's mistake
        (SpecInvalid), found here on the device, before the ledger's keys would."""
        names = [self.disk_name(r) for r in refs]
        for i, n in enumerate(names):
            if n is not None and n in names[:i]:
                raise SpecInvalid(f"{refs[i]!r} is {n}, as disks[{names.index(n)}] is: name a disk once",
                                  field=f"disks[{i}].disk")
        return names

    def get(self, vm_id: str) -> VmRecord:
        try:
            check_vm_id(vm_id)
        except ValueError as e:
            raise SpecInvalid(str(e), field="vm_id") from None
        rec = self.ledger.get(vm_id=vm_id)
        if rec is None:
            raise NotFound(f"no VM {vm_id}", field="vm_id")
        return rec

    def list(self, label_selector: str = "") -> list[VmRecord]:
        try:
            check_label_selector(label_selector)
        except ValueError as e:
            raise SpecInvalid(str(e), field="label_selector") from None
        want = dict(kv.split("=", 1) for kv in label_selector.split(",") if "=" in kv)
        return [r for r in self.ledger.list()
                if all(r.spec.get("labels", {}).get(k) == v for k, v in want.items())]

    def delete(self, vm_id: str, grace_s: float = 0) -> None:
        _check_grace(grace_s)
        with self._changing("delete a VM"):
            self._idle(vm_id)
            rec = self.get(vm_id)
            if rec.state in (VmState.INCOMING, VmState.MIGRATING):
                raise MigrationInProgress(f"{rec.name} is {rec.state}: AbortMigration on the target first "
                                          "(or wait for MigrateVM)", field="vm_id")
            self.ledger.set_state(vm_id, VmState.DELETING)
            self.emit(vm_id, VmState.DELETING)
            if grace_s > 0:
                with self._busy_unlocked(vm_id, "deleting"):  # as StopVM's: the other VMs' changes go on
                    try:
                        self.libvirt.shutdown(vm_id, grace_s)
                    except DomainError as e:
                        log.warning("shutdown vm=%s: %s; destroying", vm_id, e)
            self.teardown(vm_id, rec.claim, rec.name)
            self.emit(vm_id, VmState.DELETED)
            log.info("deleted vm=%s name=%s", vm_id, rec.name)

    def stop(self, vm_id: str, grace_s: float = 30) -> VmRecord:
        """The guest's shutdown (ACPI, destroyed after ``grace_s``) runs outside the
        manager's lock, the VM marked busy: a guest that takes its whole grace holds up
        changes to itself only, not to the host's other VMs (it held every change, and
        the reconcile, for up to 300 s). The carve lock stays shared throughout."""
        _check_grace(grace_s)
        with self._changing("stop a VM"):
            self._idle(vm_id)
            self.get(vm_id)
            with self._busy_unlocked(vm_id, "stopping"):
                self.libvirt.shutdown(vm_id, grace_s)
            self.ledger.set_state(vm_id, VmState.STOPPED, "stopped by request")
            self.emit(vm_id, VmState.STOPPED, "stopped by request")
            return self.get(vm_id)

    @contextlib.contextmanager
    def _busy_unlocked(self, vm_id: str, what: str) -> Iterator[None]:
        """Under the lock (held once: ``_changing``'s): the block runs with ``vm_id`` marked
        busy and the lock released, taken again after it. The mark is cleared under the
        lock, so whoever waits in ``_idle`` for the VM goes on only once the caller has
        finished under the lock (set the row, torn it down) and released it."""
        self._busy[vm_id] = what
        log.info("%s vm=%s (a guest's shutdown, outside the manager's lock)", what, vm_id)
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()
            del self._busy[vm_id]
            self._quiet.notify_all()

    def start(self, vm_id: str) -> VmRecord:
        with self._changing("start a VM"):
            self._idle(vm_id)
            rec = self.get(vm_id)
            if rec.state != VmState.RUNNING:
                self.libvirt.start(vm_id)
                self.ledger.set_state(vm_id, VmState.RUNNING)
                self.emit(vm_id, VmState.RUNNING)
            return self.get(vm_id)

    def update_io(self, vm_id: str, disks: list[DiskSpec],
                  vf_rates: list[tuple[str, int, int]]) -> VmRecord:
        """Live change of disk throttles (by disk name/id) and VF rates (by VF PCI
        address, or pf:index). Budgets are re-checked; nothing changes on refusal, and
        a request that changes nothing writes nothing."""
        _check_io_request(disks, vf_rates)
        if not disks and not vf_rates:
            return self.get(vm_id)
        with self._changing("change a VM's IO limits"):
            self._idle(vm_id)
            rec = self.get(vm_id)
            spec = VmSpec.from_dict(rec.spec)
            own = {d.name: d for d in rec.claim.disks}
            used = self.ledger.usage()
            names = self._resolve_disks([d.disk for d in disks])
            targets = self._disk_targets(vm_id)
            plan: list[tuple[str, DiskSpec]] = []
            for i, (d, name) in enumerate(zip(disks, names)):
                if name is None or name not in own:
                    raise Refused(f"{d.disk!r} is not one of this VM's disks ({', '.join(own) or 'none'})",
                                  field=f"disks[{i}].disk")
                budget = next(b for b in self.layout.disks if b.name == name)
                others_bytes = used.disks.get(name, (0, 0))[0] - own[name].bytes_sec
                others_iops = used.disks.get(name, (0, 0))[1] - own[name].iops
                if budget.bytes_sec and others_bytes + d.iotune.bytes_sec > budget.bytes_sec:
                    raise Refused(f"above {name}'s remaining budget "
                                  f"{budget.bytes_sec - others_bytes} bytes/s", field=f"disks[{i}].iotune")
                if budget.iops and others_iops + d.iotune.iops > budget.iops:
                    raise Refused(f"above {name}'s remaining budget {budget.iops - others_iops} IOPS",
                                  field=f"disks[{i}].iotune")
                if budget.bytes_sec and not d.iotune.bytes_sec:
                    raise Refused(f"{name} has an IO budget: set a limit", field=f"disks[{i}].iotune")
                if name not in targets:
                    raise Refused(f"{name} is not attached to the running domain", field=f"disks[{i}].disk")
                plan.append((name, d))
            vf_plan = []
            for i, (ref, mx, mn) in enumerate(vf_rates):
                v = next((v for v in rec.claim.vfs if ref in (self.vf_pci.get((v.pf, v.index)),
                                                              f"{v.pf}:{v.index}")), None)
                if v is None:
                    raise Refused(f"{ref!r} is not one of this VM's VFs", field=f"vfs[{i}].vf_pci")
                if any(v is w for w, _, _ in vf_plan):
                    raise SpecInvalid(f"{ref!r} is a VF named before: name a VF once", field=f"vfs[{i}].vf_pci")
                if mn and not self.min_rate_supported(v.pf):
                    raise Refused(f"{v.pf} does not support a minimum VF tx rate",
                                  field=f"vfs[{i}].min_tx_rate_mbps")
                vf_plan.append((v, mx, mn))
            for name, d in plan:
                self.libvirt.set_iotune(vm_id, targets[name], d.iotune.libvirt_params())
            for v, mx, mn in vf_plan:
                if self.vf_rates is None:
                    raise Refused("VF rate limits need netlink", field="vfs")
                self.vf_rates.set_rate(v.pf, v.index, mx, mn)
            new_disks = {name: d for name, d in plan}
            spec = dataclasses.replace(spec, disks=tuple(
                dataclasses.replace(d, iotune=new_disks[n].iotune) if (n := self.disk_name(d.disk)) in new_disks
                else d for d in spec.disks))
            new_vfs = {(v.pf, v.index): (mx, mn) for v, mx, mn in vf_plan}
            c = dataclasses.replace(rec.claim, disks=tuple(
                dataclasses.replace(x, bytes_sec=new_disks[x.name].iotune.bytes_sec,
                                    iops=new_disks[x.name].iotune.iops) if x.name in new_disks else x
                for x in rec.claim.disks), vfs=tuple(
                dataclasses.replace(v, max_tx_rate_mbps=new_vfs[(v.pf, v.index)][0],
                                    min_tx_rate_mbps=new_vfs[(v.pf, v.index)][1])
                if (v.pf, v.index) in new_vfs else v for v in rec.claim.vfs))
            with self.ledger.tx() as db:
                self.ledger.update_claim(db, vm_id, c, spec.to_dict())
            self.generation += 1
            return self.get(vm_id)

    def disk_name(self, ref: str) -> str | None:
        return next((b.name for b in self.layout.disks if ref in (b.name, b.id)), None)

    def _disk_targets(self, vm_id: str) -> dict[str, str]:
        """disk kernel name -> guest target dev, from the live domain XML."""
        root = ET.fromstring(self.libvirt.xml(vm_id))
        out = {}
        for d in root.iterfind("./devices/disk"):
            src, tgt = d.find("source"), d.find("target")
            if src is not None and tgt is not None and src.get("dev", "").startswith("/dev/"):
                out[src.get("dev", "")[5:]] = tgt.get("dev", "")
        return out

    # ------------------------------------------------------------ restart safety

    def reconcile(self, *, periodic: bool = False) -> list[str]:
        """Make ledger and libvirt agree; return what was done (for logs and Health).
        ``periodic``: the daemon's timer, not a start or a reconnect: rows a call of this
        process still owns (``CALL_OWNED``: a migration prepared here and not yet
        completed, a VM being moved away) are that call's, not leftovers, and are left
        alone.

        - ``creating`` rows (hostd died mid-create): roll back domain, VF, claim.
        - ``deleting`` rows: finish the delete.
        - a row whose domain is gone: release the claim (the VM is reported lost).
        - a row whose domain is shut off: state ``stopped``; running: ``running``.
        - an owned domain without a row: adopt it from its metadata when its claim
          still fits the ledger, else leave it alone and report the conflict.
        - ``incoming`` rows (a migration target, hostd/apply/migration.py): a running
          domain stays incoming (CompleteMigration or AbortMigration decides); with no
          domain, or one shut off, the claim is released and any domain undefined.
        - ``migrating`` rows (a migration source): a domain still here is ``running``
          again (a job libvirtd still drives ends in a lifecycle event); a domain gone
          is released like any other: it left with the migration. Which host runs it
          is the scheduler's to check (both hosts' ledgers), not this host's.
        """
        actions: list[str] = []
        with self._changing("reconcile"):
            domains = {d.uuid: d for d in self.libvirt.owned()}
            for rec in self.ledger.list():
                dom = domains.pop(rec.vm_id, None)
                if rec.vm_id in self._busy or (periodic and rec.state in CALL_OWNED):
                    continue  # a call works on it (its guest shutting down, a move): the call sets its row
                if rec.state == VmState.INCOMING:
                    actions.append(self._reconcile_incoming(rec, dom))
                elif rec.state in (VmState.CREATING, VmState.DELETING):
                    self.teardown(rec.vm_id, rec.claim, rec.name)
                    actions.append(f"rolled back {rec.state} vm {rec.vm_id} ({rec.name})")
                    self.emit(rec.vm_id, VmState.FAILED if rec.state == VmState.CREATING else VmState.DELETED,
                              "hostd restarted during " + rec.state)
                elif dom is None:
                    self._reset_vf_rates(rec.claim)
                    with self.ledger.tx() as db:
                        self.ledger.release(db, rec.vm_id)
                    actions.append(f"released vm {rec.vm_id} ({rec.name}): its domain is gone")
                    self.emit(rec.vm_id, VmState.FAILED, "domain disappeared")
                else:
                    state = VmState.RUNNING if dom.active else VmState.STOPPED
                    if state != rec.state:
                        self.ledger.set_state(rec.vm_id, state, "" if dom.active else "found shut off")
                        actions.append(f"vm {rec.vm_id} ({rec.name}) is {state}, ledger said {rec.state}")
                        self.emit(rec.vm_id, state)
            for dom in domains.values():
                actions.append(self._adopt(dom))
            if actions or not periodic:  # the timer's reconcile that found nothing changed nothing
                self.generation += 1
        for a in actions:
            log.warning("reconcile: %s", a)
        return actions

    def _reconcile_incoming(self, rec: VmRecord, dom) -> str:
        if dom is not None and dom.active:
            return f"incoming vm {rec.vm_id} ({rec.name}) runs here: waits for CompleteMigration or AbortMigration"
        self.teardown(rec.vm_id, rec.claim, rec.name)
        self.emit(rec.vm_id, VmState.DELETED, "incoming migration with no running domain after a restart")
        return f"released incoming vm {rec.vm_id} ({rec.name}): no running domain"

    def reconcile_logged(self, *, periodic: bool = False) -> None:
        """``reconcile`` for a daemon thread: counted, and a failure logged, never raised."""
        try:
            actions = self.reconcile(periodic=periodic)
        except Exception:
            log.exception("reconcile failed")
            return
        if self.metrics:
            self.metrics.reconcile_actions.inc(len(actions))

    def on_reconnect(self) -> None:
        """libvirtd came back (LibvirtHost calls this on a thread of its own): resync
        what changed while hostd was blind."""
        self.reconcile_logged()

    def _adopt(self, dom) -> str:
        try:
            md = VmMetadata.from_xml(dom.metadata)
        except BadMetadata as e:
            return f"left domain {dom.name} alone: unreadable hostd metadata ({e})"
        if md.vm_id != dom.uuid:
            return f"left domain {dom.name} alone: metadata vm id {md.vm_id} != uuid {dom.uuid}"
        try:
            with self.ledger.tx() as db:
                self.ledger.record(db, vm_id=md.vm_id, request_id=md.request_id, name=dom.name,
                                   claim=md.claim, spec=md.spec.to_dict(),
                                   state=VmState.RUNNING if dom.active else VmState.STOPPED)
        except HostdError as e:
            return f"left domain {dom.name} alone: its claim conflicts with the ledger ({e})"
        self.emit(md.vm_id, VmState.RUNNING if dom.active else VmState.STOPPED, "adopted")
        return f"adopted domain {dom.name} ({md.vm_id}) from its metadata"

    def on_domain_event(self, vm_id: str, state: str, reason: str) -> None:
        """A libvirt lifecycle event for one of our domains (on a listener thread of its
        own). Rows mid-create, mid-delete or mid-migration, and VMs being stopped, belong
        to the call in progress and are left alone. Handled under the manager's lock: a
        reconcile (a reconnect's, on a thread of its own) lists the domains and then
        writes the ledger from that list, and an event written in between was undone by
        it; after the reconcile, the event reads the domain as it is."""
        with self._lock:
            rec = self.ledger.get(vm_id=vm_id)
            if rec is None or rec.state in CALL_OWNED or rec.state == state or vm_id in self._busy:
                return
            # Each event is handled on a thread of its own (libvirt_host._call), so a STARTED
            # can be handled after the STOPPED that followed it: the event says that the
            # domain changed, the domain says what it is now. One that disagrees is stale.
            try:
                active = self.libvirt.active(vm_id)
            except DomainError as e:
                log.warning("domain event vm=%s %s: cannot read the domain (%s); reconcile decides", vm_id, state, e)
                return
            if active is None or active != (state == VmState.RUNNING):
                log.info("domain event vm=%s %s (%s): stale, the domain is %s now", vm_id, state, reason,
                         "gone" if active is None else "running" if active else "shut off")
                return
            self.ledger.set_state(vm_id, state, reason)
            log.info("domain event vm=%s %s -> %s (%s)", vm_id, rec.state, state, reason)
            self.emit(vm_id, state, reason)

    # ------------------------------------------------------------ inventory

    def inventory(self) -> dict:
        lay = self.layout  # once: a carve may swap it meanwhile
        used = self.ledger.usage()
        nodes = []
        for n in lay.nodes:
            nodes.append({"node": n.node, "vm_cpus": list(n.vm_cpus),
                          "used_cpus": sorted(c for c in used.cpus if c in n.vm_cpus),
                          "hugepages": [{"size_kb": t.size_kb, "total": t.count,
                                         "used": used.pages.get((n.node, t.size_kb), 0)}
                                        for t in n.hugepages]})
        pfs = [{"name": p.name, "node": -1 if p.node is None else p.node, "vfs_total": p.numvfs,
                "vfs_used": sum(1 for pf, _ in used.vfs if pf == p.name),
                "bandwidth_mbps": p.bandwidth_mbps, "reserved_mbps": used.min_rate_mbps.get(p.name, 0),
                "min_tx_rate_supported": self.min_rate_supported(p.name)} for p in lay.pfs]
        owner = {d.name: r.vm_id for r in self.ledger.list() for d in r.claim.disks}
        disks = [{"name": d.name, "id": d.id or "", "node": -1 if d.node is None else d.node,
                  "size_bytes": d.size_bytes, "bytes_sec_budget": d.bytes_sec, "iops_budget": d.iops,
                  "bytes_sec_used": used.disks.get(d.name, (0, 0))[0],
                  "iops_used": used.disks.get(d.name, (0, 0))[1], "vm_id": owner.get(d.name, ""),
                  "atomic_unit_bytes": d.atomic_unit_bytes, "atomic_write_bytes": d.atomic_write_bytes,
                  "atomic_note": d.atomic_note}
                 for d in lay.disks]
        return {"generation": self.generation, "nodes": nodes, "pfs": pfs, "disks": disks}


def _check_grace(grace_s: float) -> None:
    try:
        check_grace_seconds(int(grace_s))
    except ValueError as e:
        raise SpecInvalid(str(e), field="grace_seconds") from None


def _check_io_request(disks: list[DiskSpec], vf_rates: list[tuple[str, int, int]]) -> None:
    """UpdateIOLimits' fields against their bounds (``api.bounds``), as CreateVM's."""
    checks: list[tuple[str, Callable[[], object]]] = [
        ("disks", lambda: check_count(len(disks), DISKS_MAX, "disks")),
        ("vfs", lambda: check_count(len(vf_rates), VFS_MAX, "VFs"))]
    checks += [(f"disks[{i}].disk", lambda d=d: check_disk_ref(d.disk)) for i, d in enumerate(disks)]
    checks += [(f"vfs[{i}].vf_pci", lambda r=r: check_vf_ref(r[0])) for i, r in enumerate(vf_rates)]
    for field, check in checks:
        try:
            check()
        except ValueError as e:
            raise SpecInvalid(str(e), field=field) from None
    for i, d in enumerate(disks):
        bad = d.iotune.check(f"disks[{i}].iotune")
        if bad:
            raise SpecInvalid(bad[1], field=bad[0])


def _mac(request_id: str, i: int) -> str:
    """A locally administered unicast MAC, stable for (request, VF index)."""
    h = hashlib.sha256(f"{request_id}/{i}".encode()).digest()
    return "52:54:00:%02x:%02x:%02x" % (h[0], h[1], h[2])

