"""hostd's migration (hostd/apply/migration.py) against libvirt's test driver and a real
SQLite ledger: the target's prepare, refusal, complete and abort; the source's refusals;
and the restart rules for ``incoming`` and ``migrating`` rows. The move itself needs two
real libvirtds: tests/hostd/migrate/test_hostd_migrate.py."""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from api.layout import DiskBudget, HugepageTarget, IoServiceTarget, Layout, NodeLayout
from hostd.apply.images import ImageStore
from hostd.apply.ledger import Ledger
from hostd.apply.libvirt_host import LibvirtHost
from hostd.apply.migration import MigrateRequest, Migrations, SourceDisk
from hostd.apply.vms import VmManager
from hostd.carve.vmspec import DiskSpec, IoTune, VmSpec
from hostd.domain.metadata import NS, VmMetadata
from hostd.errors import (Conflict, MigrationArrived, MigrationFailed, MigrationInProgress, MigrationNoDisk,
                          MigrationNotRunning, NotArrived, NotIncoming, PostcopyUnsupported, SpecInvalid)
from tools.dev.domains import remove_domains

SIZE = 256 * 2**20
LAYOUT = Layout(
    nodes=(NodeLayout(0, io_cpus=(0,), host_cpus=(1,), vm_cpus=(2, 3), hugepages=(HugepageTarget(2048, 256),)),),
    pfs=(), disks=(DiskBudget("loop7", None, 0, SIZE, 0, 0), DiskBudget("loop5", None, 0, SIZE, 0, 0),
                   DiskBudget("loop9", None, 0, 2 * SIZE, 0, 0)),
    io_service=IoServiceTarget("none", ""), vm_cgroup="machine", reboot_required=())
PREFIX = "mig-"


def render(md: VmMetadata, image) -> str:
    disks = "".join(f"<disk type='block' device='disk'><source dev='/dev/{d.name}'/>"
                    f"<target dev='vd{chr(97 + i)}' bus='virtio'/><serial>{s.serial or d.name}</serial></disk>"
                    for i, (d, s) in enumerate(zip(md.claim.disks, md.spec.disks)))
    return (f"<domain type='test'><name>{md.spec.name}</name><uuid>{md.vm_id}</uuid>"
            f"<metadata>{md.to_xml()}</metadata><memory unit='MiB'>{md.spec.memory_mib}</memory>"
            f"<vcpu>{md.spec.vcpus}</vcpu><os><type arch='x86_64'>hvm</type></os>"
            f"<devices>{disks}</devices></domain>")


@pytest.fixture
def env(tmp_path: Path):
    (tmp_path / "vmlinuz").write_bytes(b"kernel")
    images = ImageStore(tmp_path / "images")
    images.add("smoke", "1", "kernel", {"kernel": tmp_path / "vmlinuz"})
    lv = LibvirtHost("test:///default", NS)
    made: list[VmManager] = []

    def manager() -> VmManager:
        m = VmManager(layout=LAYOUT, siblings={c: (c,) for c in range(4)}, ledger=Ledger(tmp_path / "ledger.db"),
                      libvirt=lv, images=images, render=render, disk_check=lambda n: [])
        made.append(m)
        return m
    yield manager, lv
    remove_domains(lv.conn(), PREFIX)
    for m in made:
        m.ledger.close()
    lv.close()


def vm_spec(name: str = "mig-a") -> VmSpec:
    return VmSpec(request_id=f"req-{name}", name=name, vcpus=1, memory_mib=128, image="smoke",
                  disks=(DiskSpec("loop3", IoTune(total_bytes_sec=2**20, total_iops_sec=100)),))


def prepare(mig: Migrations, vm_id: str, *, size: int = SIZE, rid: str = "mig-1", name: str = "mig-a"):
    return mig.prepare(request_id=rid, vm_id=vm_id, spec=vm_spec(name), source_disks=(SourceDisk("loop3", size),),
                       source_host="host-a")


def test_prepare_claims_a_same_size_disk_renders_and_defines_nothing(env):
    manager, lv = env
    m = manager()
    mig = Migrations(m, migration_address="10.0.0.2")
    vm_id = str(uuid.uuid4())
    p = prepare(mig, vm_id)
    assert p.record.state == "incoming" and p.record.vm_id == vm_id and "mig-1" in p.record.reason
    assert p.migrate_uri == "tcp://10.0.0.2"
    assert p.disks == (("loop5", "vda"),)  # a free disk of the size, first by name (loop9 is bigger)
    x = ET.fromstring(p.domain_xml)
    assert x.findtext("uuid") == vm_id
    assert x.find("./devices/disk/source").get("dev") == "/dev/loop5"
    assert x.findtext("./devices/disk/serial") == "loop3"  # the guest's name of its disk
    inv = m.inventory()
    assert inv["nodes"][0]["used_cpus"] == [2] and inv["nodes"][0]["hugepages"][0]["used"] == 64
    assert {d["name"]: d["vm_id"] for d in inv["disks"]}["loop5"] == vm_id
    assert [d.name() for d in lv.conn().listAllDomains() if d.name().startswith(PREFIX)] == []
    # a retry answers the same; another migration of the same VM id is a conflict
    assert prepare(mig, vm_id).disks == p.disks and len(m.list()) == 1
    with pytest.raises(Conflict):
        prepare(mig, vm_id, rid="mig-2")
    # a second VM takes the other disk of the size
    assert prepare(mig, str(uuid.uuid4()), rid="mig-3", name="mig-b").disks == (("loop7", "vda"),)


def test_prepare_without_a_disk_of_the_size_changes_nothing(env):
    manager, _lv = env
    m = manager()
    before = m.inventory()
    with pytest.raises(MigrationNoDisk) as e:
        prepare(Migrations(m), str(uuid.uuid4()), size=SIZE + 512)
    assert e.value.field == "disks[0].disk" and "loop5 (268435456 bytes)" in e.value.detail
    assert m.list() == [] and m.inventory() == before


def test_complete_needs_the_running_domain_and_abort_releases(env):
    manager, lv = env
    m = manager()
    mig = Migrations(m)
    p = prepare(mig, str(uuid.uuid4()))
    with pytest.raises(NotArrived):
        mig.complete("mig-a")
    assert mig.abort("mig-a") and m.list() == [] and m.inventory()["nodes"][0]["used_cpus"] == []
    assert mig.abort("mig-a") == []  # idempotent
    p = prepare(mig, str(uuid.uuid4()), rid="mig-2")
    lv.start(lv.define("mig-a", p.domain_xml))  # what libvirt does when the migration lands
    with pytest.raises(MigrationArrived):
        mig.abort("mig-a")
    assert mig.complete("mig-a")[0].state == "running"
    assert mig.complete("mig-a")[0].state == "running"  # a retry
    with pytest.raises(NotIncoming):
        mig.abort("mig-a")


def test_restart_releases_incoming_without_domain_and_keeps_a_running_one(env):
    manager, lv = env
    m = manager()
    mig = Migrations(m)
    gone = prepare(mig, str(uuid.uuid4()))
    landed = prepare(mig, str(uuid.uuid4()), rid="mig-2", name="mig-b")
    lv.start(lv.define("mig-b", landed.domain_xml))
    m.ledger.close()
    actions = manager().reconcile()  # a restarted hostd: the same ledger and libvirt
    assert any(f"released incoming vm {gone.record.vm_id}" in a for a in actions), actions
    assert any(f"incoming vm {landed.record.vm_id} (mig-b) runs here" in a for a in actions), actions
    assert [(r.name, r.state) for r in manager().list()] == [("mig-b", "incoming")]


def test_restart_of_a_source_mid_migration(env):
    manager, lv = env
    m = manager()
    stays = m.create(VmSpec(request_id="r1", name="mig-s", vcpus=1, memory_mib=128, image="smoke"))
    left = m.create(VmSpec(request_id="r2", name="mig-t", vcpus=1, memory_mib=128, image="smoke"))
    for r in (stays, left):
        m.ledger.set_state(r.vm_id, "migrating", "to somewhere")
    lv.destroy_and_undefine(left.vm_id)  # it left with the migration
    m.ledger.close()
    actions = manager().reconcile()
    assert any(f"released vm {left.vm_id}" in a for a in actions), actions
    assert [(r.name, r.state) for r in manager().list()] == [("mig-s", "running")]


def test_migrate_refusals_leave_the_vm_running(env):
    manager, _lv = env
    m = manager()
    mig = Migrations(m)
    rec = m.create(VmSpec(request_id="r1", name="mig-s", vcpus=1, memory_mib=128, image="smoke"))
    with pytest.raises(SpecInvalid) as e:  # not a target's answer for this VM
        mig.migrate(MigrateRequest(name="mig-s", target_uri="qemu+unix:///system?socket=/x", domain_xml="<domain/>"))
    assert e.value.field == "domain_xml"
    def xml_for(vm_id: str) -> str:
        return render(VmMetadata(vm_id, rec.request_id, 0, rec.claim, VmSpec.from_dict(rec.spec)), None)
    with pytest.raises(SpecInvalid, match="prepared for VM"):
        mig.migrate(MigrateRequest(name="mig-s", target_uri="qemu+unix:///system?socket=/x",
                                   domain_xml=xml_for(str(uuid.uuid4()))))
    xml = xml_for(rec.vm_id)
    req = MigrateRequest(name="mig-s", target_uri="qemu+unix:///system?socket=/nonexistent", domain_xml=xml)
    with pytest.raises(PostcopyUnsupported):
        mig.migrate(MigrateRequest(**{**req.__dict__, "postcopy": True}))
    with pytest.raises(MigrationFailed) as e:  # the test driver cannot migrate at all
        mig.migrate(req)
    assert e.value.grpc_status == "ABORTED"
    assert [(r.name, r.state) for r in m.list()] == [("mig-s", "running")]
    assert m.get(rec.vm_id).reason == rec.reason  # a failed move leaves the row as it was
    m.ledger.set_state(rec.vm_id, "migrating")
    with pytest.raises(MigrationInProgress):
        mig.migrate(req)
    with pytest.raises(MigrationInProgress):
        m.delete(rec.vm_id)
    m.ledger.set_state(rec.vm_id, "stopped")
    with pytest.raises(MigrationNotRunning):
        mig.migrate(req)


def test_a_periodic_reconcile_leaves_moves_in_progress_to_their_calls(env):
    """hostd's timer (``reconcile_s``) runs while migrations are under way in the same
    process: a target prepared and waiting for its guest, and a source moving one away,
    are the calls' rows, not a restart's leftovers (a restart's reconcile releases the
    first, above)."""
    manager, _lv = env
    m = manager()
    mig = Migrations(m)
    waiting = prepare(mig, str(uuid.uuid4()))
    moving = m.create(VmSpec(request_id="r1", name="mig-s", vcpus=1, memory_mib=128, image="smoke"))
    m.ledger.set_state(moving.vm_id, "migrating", "to somewhere")
    before = m.inventory()["generation"]
    assert m.reconcile(periodic=True) == [] and m.inventory()["generation"] == before
    assert sorted((r.name, r.state) for r in m.list()) == [("mig-a", "incoming"), ("mig-s", "migrating")]
    assert any(f"released incoming vm {waiting.record.vm_id}" in a for a in m.reconcile())  # a restart's
