"""Live migration of a VM between two hosts, hostd's part on each end.

The caller (the scheduler) drives four calls; hostd keeps each host's ledger true at
every step and leaves the running copy alone on any failure:

1. ``prepare`` on the TARGET: the VM's own checks (``VmManager.admit``, CreateVM's),
   a free allow-listed raw disk of exactly each source disk's size, the claim from this
   host's carve (its CPUs, its pages, its disk budgets), an exclusive hold on the disks
   (``DiskHold``, kept until the VM runs here or the migration is aborted), and the
   domain XML this host will run, rendered by the same designer as CreateVM's, with the
   source's UUID and the guest's disk serials kept (``DiskSpec.serial``: the guest knows
   its disks by them, and libvirt's ABI check compares them). The ledger row is written
   first, state ``incoming``; nothing is defined.
2. ``migrate`` on the SOURCE: ``virDomainMigrateToURI3`` peer to peer, live, the raw
   disks mirrored over NBD (non-shared disk), persistent on the target and undefined
   here, auto-converge, TLS for the streams when asked; bounded by a timeout after which
   the job is cancelled (post-copy is refused: a failed post-copy leaves no whole guest
   on either host). The row is ``migrating`` meanwhile. Success releases the claim and
   the row here; failure sets the row back to ``running`` (the VM never stopped).
3. ``complete`` on the TARGET once ``migrate`` succeeded: ``incoming`` -> ``running``.
4. ``abort`` on the TARGET otherwise: any incoming domain destroyed and undefined, the
   claim and hold released.

After a restart ``VmManager.reconcile`` applies the per-host rules (its docstring):
an ``incoming`` row without a running domain is released; a ``migrating`` row whose
domain is gone is released (it left); one whose domain runs is ``running`` again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import subprocess
import threading
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import libvirt

from api.bounds import check_request_id
from api.states import VfMigration
from hostd.apply import streams
from hostd.apply.ledger import VmRecord, VmState
from hostd.apply.vms import VmManager
from hostd.carve.vmclaim import claim
from hostd.carve.vmspec import DiskSpec, VmSpec, spec_problem
from hostd.domain.designer import vf_alias, vf_interface
from hostd.domain.metadata import NS, VmMetadata
from hostd.errors import (
    BadMetadata,
    Conflict,
    HostdError,
    MigrationArrived,
    MigrationFailed,
    MigrationInProgress,
    MigrationVf,
    MigrationNoDisk,
    MigrationNotRunning,
    MigrationTimeout,
    NoFit,
    NotArrived,
    NotFound,
    NotIncoming,
    PostcopyUnsupported,
    Refused,
    SpecInvalid,
)

log = logging.getLogger(__name__)
# A VF is a passed-through PCI function: its state lives in the device, and libvirt
# refuses to migrate a domain with one. A VF moves only as its request said it may
# (api.states.VfMigration): "failover" (QEMU's virtio-net failover pair, the VF the
# primary: QEMU unplugs it for the move and the target plugs its own), "interrupt" (hostd
# unplugs it on the source before the job; the target plugs its own after arrival);
# "none" is refused up front, naming the field, instead of failing inside libvirt.
VF_REASON = ("a VM with an SR-IOV VF does not move live with migration=none (a passed-through function cannot "
             "be migrated): create the VM with migration=failover (a virtio-net standby keeps its network while "
             "the VF is unplugged; the host needs failover_bridge) or migration=interrupt (it accepts losing the "
             "VF for the move), or replace or stop it for the maintenance")
UNPLUG_WAIT_S = 10  # how long the guest has to release a VF hostd unplugs before a move

# virsh migrate --live --p2p --copy-storage-all --persistent --undefinesource --auto-converge
BASE_FLAGS = (libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PEER2PEER | libvirt.VIR_MIGRATE_NON_SHARED_DISK
              | libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
              | libvirt.VIR_MIGRATE_AUTO_CONVERGE)
# Fault injection for the crash tests (HOSTD_TEST_FAULTS=1, HOSTD_CRASH_AT=<point>, as
# CreateVM's): the target after its row and hold, before answering; the source with its
# row "migrating" before the job, and after the job succeeded before releasing.
CRASH_POINTS = ("prepared", "migrating", "migrated")
# How long MigrateVM waits for libvirt's job-completed event, which the source does not
# always deliver once its domain is gone; the target keeps the record (CompleteMigration).
EVENT_WAIT_S = 0.5
POLL_S = 0.5  # job statistics sampled this often while a migration runs (GetMigration, fallback figures)
CANCEL_GRACE_S = 10  # a cancelled job still running this long after is stuck on a dead link


@dataclass(frozen=True)
class SourceDisk:
    disk: str  # the source's kernel name of the disk
    size_bytes: int
    serial: str = ""  # the guest's name of the disk ("" = disk): kept on the target


@dataclass(frozen=True)
class Prepared:
    record: VmRecord
    domain_xml: str
    migrate_uri: str
    disks: tuple[tuple[str, str], ...]  # (this host's disk name, guest target dev)


@dataclass(frozen=True)
class MigrateRequest:
    name: str
    target_uri: str
    domain_xml: str
    migrate_uri: str = ""
    migrate_disks: tuple[str, ...] = ()
    bandwidth_mib_s: int = 0
    max_downtime_ms: int = 0
    timeout_s: int = 0
    postcopy: bool = False
    tls: bool = False


@dataclass(frozen=True)
class JobFigures:
    job_ms: int = 0
    downtime_ms: int = 0
    data_bytes: int = 0
    memory_bytes: int = 0
    disk_bytes: int = 0
    completed_record: bool = False  # libvirt's record of the finished job, not a sample of it

    @classmethod
    def from_stats(cls, s: dict, *, completed: bool) -> "JobFigures":
        return cls(int(s.get("time_elapsed", 0)), int(s.get("downtime", 0)), int(s.get("data_processed", 0)),
                   int(s.get("memory_processed", 0)), int(s.get("disk_processed", 0)), completed)


@dataclass(frozen=True)
class Progress:
    active: bool
    elapsed_ms: int = 0
    memory_remaining_bytes: int = 0
    disk_remaining_bytes: int = 0
    memory_bps: int = 0
    expected_downtime_ms: int = 0


class Migrations:
    """``migration_address``: where peers' QEMU reaches this host's for the memory and
    disk streams (PrepareMigration answers ``tcp://<it>``); "" leaves it to libvirt
    (qemu.conf ``migration_host``). ``target_uri``: the libvirt URI peers' libvirtd dial
    to reach this host's (PrepareMigration answers it; ``peer_uri`` of the config)."""

    def __init__(self, manager: VmManager, *, migration_address: str = "", target_uri: str = "",
                 client_pki: str = ""):
        self.m = manager
        self.migrate_uri = f"tcp://{migration_address}" if migration_address else ""
        self.target_uri = target_uri
        self.client_pki = client_pki  # libvirt's pkipath for the qemu+tls URIs this source dials
        self._holds: dict[str, contextlib.ExitStack] = {}  # vm_id -> exclusive hold of its incoming disks
        self._moving: set[str] = set()  # names this host is migrating away now
        self._last: dict[str, dict] = {}  # name -> latest job statistics of its migration
        self.unplug_wait_s: float = UNPLUG_WAIT_S

    # ------------------------------------------------------------ target

    def prepare(self, *, request_id: str, vm_id: str, spec: VmSpec, source_disks: tuple[SourceDisk, ...],
                source_host: str) -> Prepared:
        try:
            check_request_id(request_id)
        except ValueError as e:
            raise SpecInvalid(str(e), field="request_id") from None
        try:
            vm_id = str(uuid.UUID(vm_id))
        except ValueError:
            raise SpecInvalid(f"{vm_id!r} is not a UUID (the source's vm_id)", field="vm_id") from None
        if len(source_disks) != len(spec.disks):
            raise SpecInvalid(f"{len(source_disks)} source disks for {len(spec.disks)} disks: one each",
                              field="source_disks")
        bad = spec_problem(spec)  # CreateVM's bounds, before anything is looked up or written
        if bad:
            raise SpecInvalid(bad.reason, field=f"vm.{bad.field}")
        _check_vfs_move(spec, "vm.")
        m = self.m
        spec = m._with_macs(spec)  # the source's MACs: derived from the VM's own request id
        with m._changing("prepare a migration"):
            prior = m.ledger.get(vm_id=vm_id)
            if prior is not None:
                if prior.state == VmState.INCOMING and prior.name == spec.name and prior.reason.endswith(f"(migration {request_id})"):
                    return self._answer(prior, m.images.get(spec.image))
                raise Conflict(f"VM {vm_id} is here already ({prior.name}, {prior.state})", field="vm_id")
            spec = dataclasses.replace(spec, disks=self._pick_disks(spec, source_disks))
            image = m.admit(spec)
            with m.ledger.tx() as db:
                got = claim(m.layout, m.siblings, m.ledger.usage(db), spec.request())
                if isinstance(got, NoFit):
                    raise Refused(got.reason, field=got.field)
                m.ledger.record(db, vm_id=vm_id, request_id=spec.request_id, name=spec.name, claim=got,
                                spec=spec.to_dict(), state=VmState.INCOMING)
                db.execute("UPDATE vms SET reason=? WHERE vm_id=?",
                           (f"incoming from {source_host or 'another host'} (migration {request_id})", vm_id))
            m.generation += 1
            m.emit(vm_id, VmState.INCOMING)
            try:
                if got.vfs:
                    m._set_vf_rates(got, spec)  # this host's VFs, the VM's rates
                hold = contextlib.ExitStack()
                if m.disk_hold:
                    hold.enter_context(m.disk_hold.hold([(f"disks[{i}].disk", d.name)
                                                         for i, d in enumerate(got.disks)]))
                self._holds[vm_id] = hold
                rec = m.ledger.get(vm_id=vm_id)
                assert rec is not None
                out = self._answer(rec, image)
                m._crash("prepared")
            except Exception as e:
                log.error("prepare failed vm=%s name=%s error=%s; releasing", vm_id, spec.name, e)
                self._unhold(vm_id)
                m.teardown(vm_id, got, spec.name)
                m.emit(vm_id, VmState.DELETED, str(e))
                raise
            log.info("prepared incoming vm=%s name=%s from=%s cpus=%s disks=%s", vm_id, spec.name, source_host,
                     got.vcpu_pins, [d.name for d in got.disks])
            return out

    def _pick_disks(self, spec: VmSpec, source_disks: tuple[SourceDisk, ...]) -> tuple[DiskSpec, ...]:
        """A free allow-listed disk of exactly each source disk's size (the NBD copy needs
        equal sizes) that offers the atomic unit the VM's disk asked for, first by name;
        the same usability checks as CreateVM's."""
        lay, used = self.m.layout, self.m.ledger.usage()
        taken: set[str] = set(used.disks)
        out = []
        for i, (d, src) in enumerate(zip(spec.disks, source_disks)):
            free = [b for b in lay.disks if b.name not in taken]
            fits = [b for b in free if b.size_bytes == src.size_bytes and b.atomic_write_bytes >= d.atomic_write_bytes
                    and not self.m.disk_check(b.name)]
            if not fits:
                have = ", ".join(f"{b.name} ({b.size_bytes} bytes)" for b in free) or "none"
                raise MigrationNoDisk(f"no free allow-listed disk of {src.size_bytes} bytes for {src.disk} "
                                      f"(free here: {have})", field=f"disks[{i}].disk")
            best = sorted(fits, key=lambda b: b.name)[0]
            taken.add(best.name)
            out.append(DiskSpec(best.name, d.iotune, serial=src.serial or src.disk,
                                atomic_write_bytes=d.atomic_write_bytes))
        return tuple(out)

    def _answer(self, rec: VmRecord, image) -> Prepared:
        """The XML from the designer, as CreateVM's: the spec carries the guest's disk
        serials (``DiskSpec.serial``), so the same render holds after a restart or on
        the next move."""
        m = self.m
        spec = VmSpec.from_dict(rec.spec)
        md = VmMetadata(rec.vm_id, rec.request_id, int(rec.created), rec.claim, spec)
        booted = m.overlays.prepare(spec.name, image) if m.overlays else image
        # a VF the source unplugs for the move is not in the XML the job carries (libvirt
        # compares the devices): CompleteMigration plugs this host's one
        xml = without_devices(m.render(md, booted), [vf_alias(i) for i in _moving_vfs(spec, VfMigration.INTERRUPT)])
        targets = block_targets(xml)
        return Prepared(rec, xml, self.migrate_uri, tuple((d.name, targets.get(d.name, "")) for d in rec.claim.disks))

    def complete(self, name: str) -> tuple[VmRecord, JobFigures]:
        """The VM runs here: the row ``running``, and libvirt's record of the job here."""
        m = self.m
        with m._changing("complete a migration"):
            rec = self._by_name(name)
            if rec.state == VmState.RUNNING:
                return rec, self._completed_job(rec.vm_id)  # a retry
            if rec.state != VmState.INCOMING:
                raise NotIncoming(f"{name} is {rec.state} here, not incoming", field="name")
            state = self._domain_state(rec.vm_id)
            if state != libvirt.VIR_DOMAIN_RUNNING:
                raise NotArrived(f"{name} does not run here ({_STATE_NAMES.get(state, state)}): the migration "
                                 "has not finished (or failed: AbortMigration)", field="name")
            reason = "migrated here" + self._plug_target_vfs(rec)
            m.ledger.set_state(rec.vm_id, VmState.RUNNING, reason)
            self._unhold(rec.vm_id)  # QEMU has the disks
            m.generation += 1
            m.emit(rec.vm_id, VmState.RUNNING, reason)
            log.info("migration complete vm=%s name=%s", rec.vm_id, name)
            out = m.ledger.get(vm_id=rec.vm_id)
            assert out is not None
            self._count("target", "done")
            return out, self._completed_job(rec.vm_id)

    def _plug_target_vfs(self, rec: VmRecord) -> str:
        """Plug this host's VF of every ``interrupt`` VF into the arrived guest (live and
        in its persistent definition); "" when all are in, else what is missing: the VM
        runs here either way (one running copy), without that VF until an operator acts."""
        spec = VmSpec.from_dict(rec.spec)
        missing = []
        for i in _moving_vfs(spec, VfMigration.INTERRUPT):
            xml = vf_interface(spec, rec.claim, self.m.vf_pci, i).to_xml()
            try:
                self._attach(rec.vm_id, xml, libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG)
            except (libvirt.libvirtError, HostdError) as e:
                why = e.get_error_message() if isinstance(e, libvirt.libvirtError) else str(e)
                log.error("vm=%s arrived but its VF %d (%s) was not plugged: %s", rec.vm_id, i, vf_alias(i), why)
                missing.append(f"vfs[{i}] not plugged: {why}")
        return "; " + "; ".join(missing) if missing else ""

    # --------------------------------------------- VF plug and unplug (libvirt's device API)

    def _domain(self, vm_id: str) -> libvirt.virDomain:
        return self.m.libvirt.conn().lookupByUUIDString(vm_id)

    def _attach(self, vm_id: str, xml: str, flags: int) -> None:
        self._domain(vm_id).attachDeviceFlags(xml, flags)

    def _request_unplug(self, vm_id: str, xml: str) -> None:
        self._domain(vm_id).detachDeviceFlags(xml, libvirt.VIR_DOMAIN_AFFECT_LIVE)

    def _detach(self, vm_id: str, xml: str) -> None:
        """Ask the guest to release the device (ACPI hot-unplug) and wait until it has:
        libvirt returns once QEMU was asked, the guest may take its time or refuse."""
        self._request_unplug(vm_id, xml)
        alias = ET.fromstring(xml).find("alias")
        name = "" if alias is None else alias.get("name", "")
        deadline = time.monotonic() + self.unplug_wait_s
        while name in self._plugged(vm_id):
            if time.monotonic() > deadline:
                raise MigrationVf(f"the guest has not released {name} in {self.unplug_wait_s:g} s", field="vfs")
            time.sleep(0.1)

    def _plugged(self, vm_id: str) -> set[str]:
        """Aliases of the hostdev interfaces the running domain has."""
        root = ET.fromstring(self._domain(vm_id).XMLDesc(0))
        return {a.get("name", "") for i in root.iterfind("./devices/interface[@type='hostdev']")
                if (a := i.find("alias")) is not None}

    def _unplug_source_vfs(self, rec: VmRecord) -> None:
        """Before the job: unplug every ``interrupt`` VF (the guest loses it for the move).
        A ``failover`` VF stays: QEMU unplugs the primary itself once the job starts."""
        spec = VmSpec.from_dict(rec.spec)
        for i in _moving_vfs(spec, VfMigration.INTERRUPT):
            xml = vf_interface(spec, rec.claim, self.m.vf_pci, i).to_xml()
            try:
                self._detach(rec.vm_id, xml)
            except libvirt.libvirtError as e:
                raise MigrationVf(f"cannot unplug VF {i} ({vf_alias(i)}) for the move: {e.get_error_message()}",
                                  field=f"vfs[{i}]") from None
            except MigrationVf as e:
                raise MigrationVf(f"cannot unplug VF {i}: {e.detail}", field=f"vfs[{i}]") from None
            log.info("vm=%s: VF %d (%s) unplugged for the move", rec.vm_id, i, vf_alias(i))

    def _replug_source_vfs(self, rec: VmRecord) -> str:
        """After a failed job, the VM still here: every VF that may move and is not in the
        guest now (hostd unplugged it, or QEMU did and has not put it back) is plugged
        again, live. "" when all are in, else what is missing (logged; named in the row)."""
        spec = VmSpec.from_dict(rec.spec)
        moving = _moving_vfs(spec, VfMigration.INTERRUPT) + _moving_vfs(spec, VfMigration.FAILOVER)
        if not moving:
            return ""
        missing = []
        try:
            plugged = self._plugged(rec.vm_id)
        except libvirt.libvirtError as e:
            return f"; its VFs could not be checked: {e.get_error_message()}"
        for i in sorted(moving):
            if vf_alias(i) in plugged:
                continue
            try:
                self._attach(rec.vm_id, vf_interface(spec, rec.claim, self.m.vf_pci, i).to_xml(),
                             libvirt.VIR_DOMAIN_AFFECT_LIVE)
                log.info("vm=%s: VF %d (%s) plugged back after the failed move", rec.vm_id, i, vf_alias(i))
            except libvirt.libvirtError as e:
                log.error("vm=%s: VF %d (%s) not plugged back: %s", rec.vm_id, i, vf_alias(i),
                          e.get_error_message())
                missing.append(f"vfs[{i}] not plugged back: {e.get_error_message()}")
        return "; " + "; ".join(missing) if missing else ""

    def _completed_job(self, vm_id: str) -> JobFigures:
        def op(c: libvirt.virConnect) -> JobFigures:
            try:
                stats = c.lookupByUUIDString(vm_id).jobStats(  # kept: a retry, or virsh domjobinfo, reads it too
                    libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED | libvirt.VIR_DOMAIN_JOB_STATS_KEEP_COMPLETED)
            except libvirt.libvirtError as e:
                log.warning("no completed job record of %s: %s", vm_id, e.get_error_message())
                return JobFigures()
            if stats.get("type", libvirt.VIR_DOMAIN_JOB_NONE) == libvirt.VIR_DOMAIN_JOB_NONE:
                return JobFigures()
            return JobFigures.from_stats(stats, completed=True)
        return self.m.libvirt._retrying(f"domain {vm_id}", op)  # type: ignore[return-value]

    def abort(self, name: str) -> list[str]:
        m = self.m
        with m._changing("abort a migration"):
            rec = next((r for r in m.ledger.list() if r.name == name), None)
            if rec is None:
                return []
            if rec.state != VmState.INCOMING:
                raise NotIncoming(f"{name} is {rec.state} here, not incoming", field="name")
            if self._domain_state(rec.vm_id) == libvirt.VIR_DOMAIN_RUNNING:
                raise MigrationArrived(f"{name} runs here: the migration finished (CompleteMigration)",
                                       field="name")
            m.teardown(rec.vm_id, rec.claim, rec.name)
            self._unhold(rec.vm_id)
            m.emit(rec.vm_id, VmState.DELETED, "migration aborted")
            log.info("migration aborted vm=%s name=%s", rec.vm_id, name)
            self._count("target", "aborted")
            return [f"released incoming vm {rec.vm_id} ({name}): CPUs {list(rec.claim.vcpu_pins)}, "
                    f"disks {[d.name for d in rec.claim.disks]}"]

    def _unhold(self, vm_id: str) -> None:
        hold = self._holds.pop(vm_id, None)
        if hold is not None:
            hold.close()

    def _domain_state(self, vm_id: str) -> int | None:
        """libvirt's state of the domain, None when there is none."""
        def op(c: libvirt.virConnect) -> int | None:
            try:
                return int(c.lookupByUUIDString(vm_id).state()[0])
            except libvirt.libvirtError as e:
                if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    return None
                raise
        return self.m.libvirt._retrying(f"domain {vm_id}", op)  # type: ignore[return-value]

    def _by_name(self, name: str) -> VmRecord:
        rec = next((r for r in self.m.ledger.list() if r.name == name), None)
        if rec is None:
            raise NotFound(f"no VM named {name!r}", field="name")
        return rec

    # ------------------------------------------------------------ source

    def migrate(self, req: MigrateRequest) -> JobFigures:
        if req.postcopy:
            raise PostcopyUnsupported("post-copy is not offered: a post-copy that fails leaves no whole guest "
                                      "on either host; use ON_TIMEOUT_ABORT", field="on_timeout")
        if not req.target_uri:
            raise SpecInvalid("required: the target's libvirt URI", field="target_uri")
        if not req.domain_xml:
            raise SpecInvalid("required: PrepareMigration's domain_xml", field="domain_xml")
        m = self.m
        with m._changing("migrate a VM"):
            rec = self._by_name(req.name)
            if m._idle(rec.vm_id):  # it was being stopped: as it is now
                rec = self._by_name(req.name)
            _check_vfs_move(VmSpec.from_dict(rec.spec), "")
            _check_target_xml(req.domain_xml, rec)
            if req.name in self._moving or rec.state == VmState.MIGRATING:
                raise MigrationInProgress(f"{req.name} is being migrated already", field="name")
            if rec.state != VmState.RUNNING:
                raise MigrationNotRunning(f"{req.name} is {rec.state}: only a running VM moves live", field="name")
            was = m.ledger.updated(rec.vm_id)
            m.ledger.set_state(rec.vm_id, VmState.MIGRATING, f"to {req.target_uri}")
            self._moving.add(req.name)
        m.emit(rec.vm_id, VmState.MIGRATING, f"to {req.target_uri}")
        log.info("migrating vm=%s name=%s to=%s bandwidth=%d MiB/s tls=%s", rec.vm_id, req.name, req.target_uri,
                 req.bandwidth_mib_s, req.tls)
        if m.metrics:
            m.metrics.migrating.inc()
        try:
            m._crash("migrating")
            self._unplug_source_vfs(rec)
            figures = self._run(rec, req)
            m._crash("migrated")
        except HostdError as e:
            self._failed(rec, e, was)
            self._count("source", "failed")
            raise
        except Exception as e:
            self._failed(rec, e, was)
            self._count("source", "failed")
            raise MigrationFailed(f"{type(e).__name__}: {e}") from e
        finally:
            self._moving.discard(req.name)
            self._last.pop(req.name, None)
            if m.metrics:
                m.metrics.migrating.dec()
        self._count("source", "done", figures)
        with m._changing("release a migrated VM"):
            m.teardown(rec.vm_id, rec.claim, rec.name)
        m.emit(rec.vm_id, VmState.DELETED, f"migrated to {req.target_uri}")
        log.info("migrated vm=%s name=%s job_ms=%d downtime_ms=%d", rec.vm_id, req.name, figures.job_ms,
                 figures.downtime_ms)
        return figures

    def _count(self, role: str, result: str, figures: JobFigures | None = None) -> None:
        metrics = self.m.metrics
        if metrics is None:
            return
        metrics.migrations.labels(role, result).inc()
        if figures is not None and figures.job_ms:
            metrics.migration_seconds.observe(figures.job_ms / 1000)
            metrics.migration_downtime.observe(figures.downtime_ms / 1000)

    def _failed(self, rec: VmRecord, e: BaseException, updated: float | None) -> None:
        """The VM stays here: its row back to what the domain is (gone: released)."""
        m = self.m
        with m._changing("undo a failed migration"):
            state = self._domain_state(rec.vm_id)
            if state is None:  # it left after all (the error came after the switchover)
                m.teardown(rec.vm_id, rec.claim, rec.name)
                m.emit(rec.vm_id, VmState.DELETED, f"migration reported failure but the domain left: {e}")
                log.error("migration of %s failed (%s) yet its domain left this host; released", rec.name, e)
                return
            # back to the row as it was: the failure is the caller's answer (the scheduler
            # names it on the VM), and a refused move leaves this host's ledger unchanged;
            # a VF unplugged for the move is plugged back first (named if it cannot be)
            vfs = self._replug_source_vfs(rec) if state == libvirt.VIR_DOMAIN_RUNNING else ""
            m.ledger.set_state(rec.vm_id, VmState.RUNNING if state != libvirt.VIR_DOMAIN_SHUTOFF else VmState.STOPPED,
                               rec.reason + vfs, updated=None if vfs else updated)
        m.emit(rec.vm_id, VmState.RUNNING, f"migration failed: {e}")
        log.error("migration of %s failed, it runs here still: %s", rec.name, e)

    def _run(self, rec: VmRecord, req: MigrateRequest) -> JobFigures:
        conn = self.m.libvirt.conn()
        try:
            dom = conn.lookupByUUIDString(rec.vm_id)
        except libvirt.libvirtError as e:
            raise MigrationFailed(f"domain {rec.vm_id}: {e.get_error_message()}", field="name") from None
        params: dict[str, object] = {libvirt.VIR_MIGRATE_PARAM_DEST_XML: req.domain_xml,
                                     libvirt.VIR_MIGRATE_PARAM_PERSIST_XML: req.domain_xml,
                                     libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS:
                                         list(req.migrate_disks or disk_targets(req.domain_xml))}
        if req.migrate_uri:
            params[libvirt.VIR_MIGRATE_PARAM_URI] = req.migrate_uri
        if req.bandwidth_mib_s:
            params[libvirt.VIR_MIGRATE_PARAM_BANDWIDTH] = req.bandwidth_mib_s
        flags = BASE_FLAGS | (libvirt.VIR_MIGRATE_TLS if req.tls else 0)
        if req.max_downtime_ms:
            try:
                dom.migrateSetMaxDowntime(req.max_downtime_ms, 0)
            except libvirt.libvirtError as e:
                raise MigrationFailed(f"max downtime {req.max_downtime_ms} ms: {e.get_error_message()}",
                                      field="max_downtime_ms") from None
        completed: dict[str, dict] = {}

        def on_completed(_c, d, stats, _opaque) -> None:
            if d.UUIDString() == rec.vm_id:
                completed["stats"] = dict(stats)
        cb = None
        try:
            cb = conn.domainEventRegisterAny(dom, libvirt.VIR_DOMAIN_EVENT_ID_JOB_COMPLETED, on_completed, None)
        except libvirt.libvirtError as e:
            log.warning("no job-completed event (%s): job figures from the last sample", e.get_error_message())
        done = threading.Event()
        timed_out = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(dom, req, done, timed_out), daemon=True,
                                   name=f"migrate-{req.name}")
        watcher.start()
        try:
            dom.migrateToURI3(with_pkipath(req.target_uri, self.client_pki), params, flags)
        except libvirt.libvirtError as e:
            if timed_out.is_set():
                raise MigrationTimeout(f"not done within {req.timeout_s} s; cancelled ({e.get_error_message()})",
                                       field="timeout_s") from None
            raise MigrationFailed(e.get_error_message(), field="target_uri") from None
        finally:
            done.set()
            watcher.join(5)
            if cb is not None:
                with contextlib.suppress(libvirt.libvirtError):
                    conn.domainEventDeregisterAny(cb)
        deadline = time.monotonic() + EVENT_WAIT_S  # the event comes from the event loop's thread
        while "stats" not in completed and time.monotonic() < deadline:
            time.sleep(0.05)
        if "stats" in completed:
            return JobFigures.from_stats(completed["stats"], completed=True)
        return JobFigures.from_stats(self._last.get(req.name, {}), completed=False)

    def _watch(self, dom: libvirt.virDomain, req: MigrateRequest, done: threading.Event,
               timed_out: threading.Event) -> None:
        """Samples the job for GetMigration; cancels it once timeout_s has passed, and
        closes its connections to the target if the cancel has not ended the job
        CANCEL_GRACE_S later (a dead link: hostd/apply/streams.py)."""
        start = time.monotonic()
        cancelled_at, closed = 0.0, False
        while not done.wait(POLL_S):
            with contextlib.suppress(libvirt.libvirtError):
                stats = dom.jobStats(0)
                if stats.get("type", libvirt.VIR_DOMAIN_JOB_NONE) != libvirt.VIR_DOMAIN_JOB_NONE:
                    self._last[req.name] = dict(stats)
            now = time.monotonic()
            if req.timeout_s and now - start > req.timeout_s and not timed_out.is_set():
                timed_out.set()
                cancelled_at = now
                log.warning("migration of %s passed %d s: cancelling", req.name, req.timeout_s)
                with contextlib.suppress(libvirt.libvirtError):
                    dom.abortJob()
            elif cancelled_at and not closed and now - cancelled_at > CANCEL_GRACE_S:
                closed = True
                self._close_streams(dom, req)

    def _close_streams(self, dom: libvirt.virDomain, req: MigrateRequest) -> None:
        dsts = streams.target_addresses(req.migrate_uri, req.target_uri)
        if not dsts:
            log.warning("migration of %s: cancel stuck, and neither %r nor %r names the target's address: "
                        "no connection closed", req.name, req.migrate_uri, req.target_uri)
            return
        pids = streams.qemu_pids(dom.UUIDString())
        if not pids:
            log.warning("migration of %s: cancel stuck, and no QEMU process found for it", req.name)
            return
        for pid in pids:  # the target's incoming copy, if on this machine, has no connection to dsts
            try:
                conns = streams.close_streams(pid, dsts)
            except (OSError, subprocess.SubprocessError) as e:
                log.warning("migration of %s: cancel stuck; closing its connections failed: %s", req.name, e)
                continue
            log.warning("migration of %s: the cancel has not ended the job in %d s (a dead link to the target?): "
                        "closed %d connection(s) of QEMU pid %d to %s: %s", req.name, CANCEL_GRACE_S, len(conns),
                        pid, ",".join(sorted(dsts)), ", ".join(map(str, conns)) or "none found")

    def progress(self, name: str) -> Progress:
        self._by_name(name)
        s = self._last.get(name) if name in self._moving else None
        if not s:
            return Progress(active=False)
        return Progress(True, int(s.get("time_elapsed", 0)), int(s.get("memory_remaining", 0)),
                        int(s.get("disk_remaining", 0)), int(s.get("memory_bps", 0)), int(s.get("downtime", 0)))


_STATE_NAMES = {None: "no domain", libvirt.VIR_DOMAIN_PAUSED: "paused", libvirt.VIR_DOMAIN_SHUTOFF: "shut off",
                libvirt.VIR_DOMAIN_RUNNING: "running"}


def _moving_vfs(spec: VmSpec, mode: VfMigration) -> list[int]:
    """Positions of the spec's VFs that take a move the ``mode`` way."""
    return [i for i, v in enumerate(spec.vfs) if v.migration == mode]


def _check_vfs_move(spec: VmSpec, where: str) -> None:
    """A VF whose request did not say how it moves refuses the move (``where``: the
    field's prefix, "vm." in PrepareMigration)."""
    for i, v in enumerate(spec.vfs):
        if v.migration not in (VfMigration.FAILOVER, VfMigration.INTERRUPT):
            raise MigrationVf(VF_REASON, field=f"{where}vfs[{i}].migration")


def without_devices(xml: str, aliases: list[str]) -> str:
    """The domain XML without the interfaces of these user aliases (as text: the rest
    kept as rendered)."""
    if not aliases:
        return xml
    root = ET.fromstring(xml)
    devices = root.find("devices")
    if devices is not None:
        for el in list(devices.iterfind("interface")):
            a = el.find("alias")
            if a is not None and a.get("name") in aliases:
                devices.remove(el)
    return ET.tostring(root, encoding="unicode")


def _check_target_xml(xml: str, rec: VmRecord) -> None:
    """The target's XML is a hostd's rendering of this VM (its metadata names this VM id;
    libvirt checks the rest: UUID, devices, serials)."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as e:
        raise SpecInvalid(f"not XML: {e}", field="domain_xml") from None
    md = root.find(f"./metadata/{{{NS}}}vm")
    if md is None:
        raise SpecInvalid("no hostd metadata: not a PrepareMigration answer", field="domain_xml")
    try:
        got = VmMetadata.from_xml(ET.tostring(md, encoding="unicode"))
    except BadMetadata as e:  # the caller's XML, not this host's record: the caller's fault
        raise SpecInvalid(f"hostd metadata does not parse: {e}", field="domain_xml") from None
    if got.vm_id != rec.vm_id or root.findtext("uuid") != rec.vm_id:
        raise SpecInvalid(f"prepared for VM {got.vm_id}, not {rec.name} ({rec.vm_id})", field="domain_xml")


def disk_targets(xml: str) -> list[str]:
    """Guest targets of the writable disks of a domain XML: what the NBD copy moves."""
    root = ET.fromstring(xml)
    return [t.get("dev", "") for d in root.iterfind("./devices/disk")
            if d.get("device", "disk") == "disk" and d.find("readonly") is None
            and (t := d.find("target")) is not None]


def block_targets(xml: str) -> dict[str, str]:
    """Host disk name (of a block disk's ``/dev/...`` source) -> guest target, of a domain XML."""
    out = {}
    for d in ET.fromstring(xml).iterfind("./devices/disk"):
        src, tgt = d.find("source"), d.find("target")
        if src is not None and tgt is not None and src.get("dev"):
            out[src.get("dev", "").rsplit("/", 1)[-1]] = tgt.get("dev", "")
    return out


def with_pkipath(uri: str, pki: str) -> str:
    """``uri`` with libvirt's ``pkipath`` parameter (the client certificate this host's
    libvirtd presents) when it is a TLS URI that names none; otherwise as it is."""
    if not pki or not uri.split(":", 1)[0].endswith("+tls") or "pkipath=" in uri:
        return uri
    return f"{uri}{'&' if '?' in uri else '?'}pkipath={urllib.parse.quote(pki, safe='/')}"


def peer_uri(cfg) -> str:  # type: ignore[no-untyped-def]
    """The libvirt URI a peer's libvirtd dials to reach this host's (a migration's
    target_uri): ``migration_libvirt_uri``, else qemu+tls to ``migration_address``, else
    this hostd's own ``libvirt_uri`` (one machine only)."""
    if cfg.migration_libvirt_uri:
        return str(cfg.migration_libvirt_uri)
    if cfg.migration_address:
        return f"qemu+tls://{cfg.migration_address}/system"
    return str(cfg.libvirt_uri)
