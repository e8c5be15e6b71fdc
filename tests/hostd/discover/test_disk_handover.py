"""Disk safety beyond mounts, on real loop devices: a disk with a filesystem or LVM
signature, one a process holds open raw, one mounted only in another mount namespace,
each refused by the probe hostd runs right before handover and by CreateVM (VmManager on
libvirt's test driver with the real probe and the real O_EXCL hold), with the first MiB
of the disk byte-identical before and after every refusal; ``wipe_ok`` hands a disk
with a signature over."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api.layout import DiskBudget, HugepageTarget, IoServiceTarget, Layout, NodeLayout
from hostd.apply.diskhold import DiskHold
from hostd.apply.images import ImageStore
from hostd.apply.ledger import Ledger
from hostd.apply.libvirt_host import LibvirtHost
from hostd.apply.vms import VmManager
from hostd.carve.vmspec import DiskSpec, VmSpec
from hostd.discover import DiskProbe, discover_host
from hostd.discover.diskuse import describe
from hostd.domain.metadata import NS, VmMetadata
from hostd.errors import Refused

pytestmark = [pytest.mark.integration, pytest.mark.root]


def first_mib(dev: Path) -> str:
    with open(dev, "rb") as f:
        return hashlib.sha256(f.read(1 << 20)).hexdigest()


def render(md: VmMetadata, image) -> str:  # type: ignore[no-untyped-def]
    disks = "".join(f"<disk type='block' device='disk'><source dev='/dev/{d.name}'/>"
                    f"<target dev='vdb' bus='virtio'/></disk>" for d in md.claim.disks)
    return (f"<domain type='test'><name>{md.spec.name}</name><uuid>{md.vm_id}</uuid>"
            f"<metadata>{md.to_xml()}</metadata><memory unit='MiB'>{md.spec.memory_mib}</memory>"
            f"<vcpu>{md.spec.vcpus}</vcpu><os><type arch='x86_64'>hvm</type></os>"
            f"<devices>{disks}</devices></domain>")


@pytest.fixture
def manager(tmp_path: Path, loop_disk: Path):
    name = loop_disk.name
    layout = Layout(nodes=(NodeLayout(0, (0,), (), (1,), (HugepageTarget(2048, 64),)),), pfs=(),
                    disks=(DiskBudget(name, None, None, 256 << 20, 0, 0),),
                    io_service=IoServiceTarget("none", ""), vm_cgroup="machine", reboot_required=())
    (tmp_path / "vmlinuz").write_bytes(b"k")
    images = ImageStore(tmp_path / "images")
    images.add("smoke", "1", "kernel", {"kernel": tmp_path / "vmlinuz"})
    lv = LibvirtHost("test:///default", NS)
    made: list[VmManager] = []

    def make(wipe_ok: tuple[str, ...] = ()) -> VmManager:
        m = VmManager(layout=layout, siblings={}, ledger=Ledger(tmp_path / f"ledger{len(made)}.db"), libvirt=lv,
                      images=images, render=render, disk_check=DiskProbe(Path("/"), ("loop*",), wipe_ok),
                      disk_hold=DiskHold(Path("/dev")))
        made.append(m)
        return m
    yield make
    for m in made:
        for r in m.list():
            m.delete(r.vm_id)
        m.ledger.close()
    lv.close()


def create(m: VmManager, disk: str, name: str = "dh-1") -> None:
    m.create(VmSpec(request_id=f"r-{name}", name=name, vcpus=1, memory_mib=128, image="smoke",
                    disks=(DiskSpec(disk),)))


def refused(m: VmManager, dev: Path, words: str) -> None:
    """CreateVM is refused naming the disk field and the reason; nothing is left and the
    disk's first MiB did not change."""
    before = first_mib(dev)
    with pytest.raises(Refused) as e:
        create(m, dev.name)
    assert e.value.field == "disks[0].disk" and words in e.value.detail, e.value
    assert m.list() == []
    assert first_mib(dev) == before


def probe(dev: Path, wipe_ok: tuple[str, ...] = ()) -> list[str]:
    return DiskProbe(Path("/"), ("loop*",), wipe_ok)(dev.name)


def test_a_blank_disk_is_handed_over(manager, loop_disk: Path) -> None:
    assert probe(loop_disk) == []
    m = manager()
    create(m, loop_disk.name)
    assert [r.state for r in m.list()] == ["running"]


def test_an_unmounted_ext4_filesystem_is_refused_unless_wipe_ok(manager, loop_disk: Path) -> None:
    subprocess.run(["mkfs.ext4", "-q", "-F", str(loop_disk)], check=True)
    assert probe(loop_disk) == ["carries an ext4 filesystem signature"]
    refused(manager(), loop_disk, "ext4 filesystem signature")
    # discover shows it too, apart from the assignable flag (a VM's own use writes filesystems)
    disk = next(d for d in discover_host(Path("/"), allow=("loop*",)).disks if d.name == loop_disk.name)
    assert disk.assignable and disk.handover == ("carries an ext4 filesystem signature",)
    assert probe(loop_disk, wipe_ok=(loop_disk.name,)) == []
    m = manager(wipe_ok=(loop_disk.name,))
    create(m, loop_disk.name)
    assert [r.state for r in m.list()] == ["running"]


def test_an_lvm_physical_volume_is_refused(manager, loop_disk: Path) -> None:
    if shutil.which("pvcreate") is None:
        pytest.fail("lvm2 is missing: tools/dev/install-deps.sh installs it")
    env = {**os.environ, "DM_DISABLE_UDEV": "1", "LVM_SUPPRESS_FD_WARNINGS": "1"}
    subprocess.run(["pvcreate", "-q", "-y", "-ff", "--config", "devices { use_devicesfile = 0 }",
                    str(loop_disk)], check=True, env=env, capture_output=True)
    assert probe(loop_disk) == ["carries an LVM physical volume signature (LVM2_member)"]
    refused(manager(), loop_disk, "LVM physical volume")


def test_a_disk_held_open_raw_is_refused(manager, loop_disk: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(loop_disk)!r}, 'rb'); "
                               "print('open', flush=True); import time; time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        reasons = probe(loop_disk)
        assert reasons == [f"held open by pid {holder.pid} (python3) on {loop_disk.name}"] or \
            reasons == [f"held open by pid {holder.pid} ({Path(sys.executable).name[:15]}) on {loop_disk.name}"]
        refused(manager(), loop_disk, f"held open by pid {holder.pid}")
    finally:
        holder.kill()
        holder.communicate()  # reaps it and closes the pipe
    assert probe(loop_disk) == []


def test_a_mount_in_another_namespace_is_refused(manager, loop_disk: Path, tmp_path: Path) -> None:
    subprocess.run(["mkfs.ext4", "-q", "-F", str(loop_disk)], check=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # read-only: a writable ext4 mount writes its first MiB by itself (superblock times,
    # lazy inode-table init), which the refusal's "disk untouched" check would blame on us
    ns = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           f"mount -o ro {loop_disk} {mnt} && echo mounted && exec sleep 600"],
                          stdout=subprocess.PIPE, text=True)
    try:
        assert ns.stdout.readline().strip() == "mounted"
        assert str(mnt) not in Path("/proc/self/mountinfo").read_text()  # invisible from here
        want = f"mounted at {mnt} ({loop_disk.name}) in the mount namespace of pid {ns.pid} (sleep)"
        assert probe(loop_disk, wipe_ok=(loop_disk.name,)) == [want]
        refused(manager(wipe_ok=(loop_disk.name,)), loop_disk, f"in the mount namespace of pid {ns.pid}")
    finally:
        ns.kill()
        ns.communicate()  # reaps it and closes the pipe
    deadline = time.monotonic() + 5  # the namespace (and its mount) goes with its last process
    while probe(loop_disk, wipe_ok=(loop_disk.name,)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert probe(loop_disk, wipe_ok=(loop_disk.name,)) == []


def test_the_hold_closes_the_window_to_qemus_open(loop_disk: Path, tmp_path: Path) -> None:
    """While hostd holds the disk (define + start), nothing can mount or mkfs it; an
    exclusive user that came after the checks makes the hold refuse."""
    subprocess.run(["mkfs.ext4", "-q", "-F", str(loop_disk)], check=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with DiskHold(Path("/dev")).hold([("disks[0].disk", loop_disk.name)]):
        r = subprocess.run(["mount", str(loop_disk), str(mnt)], capture_output=True, text=True)
        assert r.returncode != 0 and "busy" in r.stderr.lower(), r.stderr
    fd = os.open(loop_disk, os.O_RDONLY | os.O_EXCL)
    try:
        with pytest.raises(Refused) as e:
            with DiskHold(Path("/dev")).hold([("disks[0].disk", loop_disk.name)]):
                pass
        assert e.value.field == "disks[0].disk" and "another exclusive user holds it" in e.value.detail
    finally:
        os.close(fd)


@pytest.mark.parametrize("found, reason", [
    ({"PTTYPE": "gpt", "PTUUID": "x"}, "a gpt partition table"),
    ({"PTTYPE": "dos"}, "a dos partition table"),
    ({"TYPE": "xfs", "USAGE": "filesystem"}, "an xfs filesystem signature"),
    ({"TYPE": "linux_raid_member", "USAGE": "raid"}, "a linux_raid_member RAID member signature"),
    ({"TYPE": "crypto_LUKS", "USAGE": "crypto"}, "a crypto_LUKS encrypted volume signature"),
    ({"TYPE": "LVM2_member", "USAGE": "raid"}, "an LVM physical volume signature (LVM2_member)"),
    ({"UUID": "only"}, None),
])
def test_blkid_findings_name_what_was_found(found: dict[str, str], reason: str | None) -> None:
    """blkid's export keys as util-linux 2.38 prints them for these signatures."""
    assert describe(found) == reason
