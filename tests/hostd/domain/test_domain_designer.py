"""The designer's policy decisions one by one, and its refusals (each names the
field). Claims are hand-written here where a test needs a shape the real
claimer would not produce (that is what the refusals guard against)."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest
from domcases import CASES, KERNEL, SIBLINGS, Case, host, spec

from hostd.apply.images import ImageStore
from hostd.carve.vmclaim import Claim, ClaimCell, ClaimedDisk, ClaimedVf, VfReq
from hostd.carve.vmspec import DiskSpec, IoTune
from hostd.domain.designer import Boot, DomainDesignError, _target, check_host, design, design_domain
from hostd.domain.elements import Domain, HugePage, IoThreadPin, MemNode, Os, Teaming, VcpuPin
from hostd.domain.metadata import NS, VmMetadata

BY_NAME = {c.name: c for c in CASES}
VM_ID = "6b1a4f3e-0000-4000-8000-00000000abcd"


def build(s, c: Claim, boot: Boot = KERNEL, **host_kw) -> Domain:
    return design(vm_id=VM_ID, spec=s, claim=c, boot=boot, host=host(**host_kw))


def claim(pins=(3, 2), emu=(1,), pages=128, size_kb=2048, node=0, vfs=(), disks=(), dedicated=False, cells=()):
    return Claim(node, tuple(pins), tuple(emu), size_kb, pages, tuple(vfs), tuple(disks), dedicated,
                 tuple(ClaimCell(*c) for c in cells))


def test_vcpus_pinned_one_to_one_in_claim_order() -> None:
    d = build(spec("a", vcpus=2), claim(pins=(3, 2)))
    assert d.cputune.vcpupins == (VcpuPin(0, "3"), VcpuPin(1, "2"))


def test_emulator_and_every_iothread_on_the_emulator_cpus() -> None:
    disks = (DiskSpec("nvme0n1"), DiskSpec("nvme1n1"))
    d = build(spec("a", vcpus=2, disks=disks),
              claim(emu=(1, 9), disks=(ClaimedDisk("nvme0n1", 0, 0), ClaimedDisk("nvme1n1", 0, 0))))
    assert d.cputune.emulatorpin == "1,9" and d.iothreads == 2
    assert d.cputune.iothreadpins == (IoThreadPin(1, "1,9"), IoThreadPin(2, "1,9"))
    assert [x.driver.iothread for x in d.devices.disks] == [1, 2]


def test_locked_is_a_host_fact() -> None:
    s, c = spec("a", vcpus=2), claim()
    assert build(s, c).memory_backing.locked is True  # production default
    assert build(s, c, lock_memory=False).memory_backing.locked is False


def test_hugepages_strict_on_the_claimed_node_and_guest_cell_only_when_asked() -> None:
    plain = build(spec("a", vcpus=2, memory_mib=2048), claim(pages=1, size_kb=1048576 * 2, node=1))
    assert plain.memory_backing.hugepages == (HugePage(2097152, None),)
    assert (plain.numatune.mode, plain.numatune.nodeset, plain.numatune.memnodes) == ("strict", "1", ())
    assert plain.cpu.cells == ()
    cell = build(spec("a", vcpus=2, memory_mib=2048, guest_numa=True), claim(pages=1024, node=1))
    assert cell.memory_backing.hugepages == (HugePage(2048, "0"),)  # guest cell 0
    assert cell.numatune.memnodes == (MemNode(0, "strict", "1"),)  # -> host node 1
    assert [(x.id, x.cpus, x.memory_kib) for x in cell.cpu.cells] == [(0, "0-1", 2 * 2**20)]


def test_spanning_vm_gets_a_cell_per_host_node_even_without_guest_numa() -> None:
    """Cell i: the next vCPUs of the claim and that node's pages, memory bound to the node."""
    d = build(spec("a", vcpus=3, memory_mib=256), claim(pins=(2, 3, 7), pages=128, node=1,
                                                          cells=((1, 1, 32), (0, 2, 96))))
    assert [(x.id, x.cpus, x.memory_kib) for x in d.cpu.cells] == [(0, "0", 65536), (1, "1-2", 196608)]
    assert d.numatune.nodeset == "0-1"
    assert d.numatune.memnodes == (MemNode(0, "strict", "1"), MemNode(1, "strict", "0"))
    assert d.memory_backing.hugepages == (HugePage(2048, "0-1"),)  # both guest cells
    assert [p.cpuset for p in d.cputune.vcpupins] == ["2", "3", "7"]


def test_cpu_model_per_virt_type() -> None:
    s, c = spec("a", vcpus=2), claim()
    kvm, tcg = build(s, c), build(s, c, virt_type="qemu")
    assert (kvm.type, kvm.cpu.mode, kvm.cpu.migratable, kvm.features.pmu) == \
        ("kvm", "host-passthrough", False, False)
    # libvirt refuses host-passthrough for TCG; 'maximum' is QEMU's -cpu max
    assert (tcg.type, tcg.cpu.mode, tcg.features.pmu) == ("qemu", "maximum", None)


@pytest.mark.parametrize("pins, threads", [((2, 10), 2), ((2, 10, 3, 11), 2), ((2, 3), 1),
                                           ((10, 2), 2), ((2, 10, 3), 1), ((2,), 1)])
def test_guest_smt_mirrors_whole_host_cores(pins, threads) -> None:
    d = build(spec("a", vcpus=len(pins)), claim(pins=pins))
    t = d.cpu.topology
    assert (t.sockets, t.cores, t.threads) == (1, len(pins) // threads, threads)


def test_raw_disks_follow_a_boot_disk_and_carry_the_spec_iotune() -> None:
    tune = IoTune(total_bytes_sec=10, total_bytes_sec_max=20, total_bytes_sec_max_length=3, group_name="g")
    s = spec("a", vcpus=2, disks=(DiskSpec("nvme-eui.1", tune), DiskSpec("nvme1n1")))
    c = claim(disks=(ClaimedDisk("nvme0n1", 10, 0), ClaimedDisk("nvme1n1", 0, 0)))
    d = build(s, c, boot=Boot(disk="/v/root.img"))
    root, a, b = d.devices.disks
    assert (root.type, root.target_dev, root.source, d.os.boot) == ("file", "vda", "/v/root.img", ("hd",))
    assert (a.type, a.source, a.target_dev, a.serial) == ("block", "/dev/nvme0n1", "vdb", "nvme0n1")
    assert (a.driver.type, a.driver.cache, a.driver.io) == ("raw", "none", "native")
    assert (a.iotune.total_bytes_sec, a.iotune.total_bytes_sec_max, a.iotune.total_bytes_sec_max_length,
            a.iotune.group_name) == (10, 20, 3, "g")
    assert b.iotune is None  # no limits: no <iotune> at all


def test_target_names_like_libvirt() -> None:
    assert [_target(i) for i in (0, 1, 25, 26, 27, 701, 702)] == \
        ["vda", "vdb", "vdz", "vdaa", "vdab", "vdzz", "vdaaa"]


def test_vf_hostdev_with_mac_and_vlan() -> None:
    d = build(spec("a", vcpus=2, vfs=(VfReq(pf="ens1f0"),)),
              claim(vfs=(ClaimedVf("ens1f0", 1, 0, 0, "52:54:00:01:02:03", 42),)))
    (i,) = d.devices.interfaces
    assert (str(i.source), i.mac, i.vlan_tags, i.managed) == ("0000:3b:02.1", "52:54:00:01:02:03", (42,), True)
    untagged = build(spec("a", vcpus=2), claim(vfs=(ClaimedVf("ens1f0", 0, 0, 0, "52:54:00:01:02:03", 0),)))
    assert untagged.devices.interfaces[0].vlan_tags == ()


def test_serial_console_logged_under_the_state_dir() -> None:
    d = build(spec("vm-x", vcpus=2), claim())
    (s,) = d.devices.serials
    assert (s.type, s.log_file, s.log_append) == ("pty", "/var/lib/hostd/vms/vm-x/console.log", True)
    assert d.devices.consoles[0].target_type == "serial"
    assert d.devices.memballoon.model == "none"


GOOD = dict(s=spec("a", vcpus=2), c=claim())


@pytest.mark.parametrize("change, field, reason", [
    (dict(host_kw={"virt_type": "xen"}), "virt_type", "not one of kvm, qemu"),
    (dict(c=claim(pins=(2,))), "claim.vcpu_pins", "1 CPUs claimed for 2 vCPUs"),
    (dict(c=claim(pins=(2, 2))), "claim.vcpu_pins", "two vCPUs"),
    (dict(c=claim(emu=())), "claim.emulator_cpus", "no CPU"),
    (dict(c=claim(emu=(3,), dedicated=True)), "claim.emulator_cpus", "also a vCPU"),
    (dict(c=claim(pages=64)), "claim.pages", "do not make memory_mib=256"),
    (dict(c=claim(cells=((0, 1, 64), (0, 1, 64)))), "claim.cells", "each cell needs its own node"),
    (dict(c=claim(cells=((0, 2, 64), (1, 0, 64)))), "claim.cells", "needs a vCPU and memory"),
    (dict(c=claim(cells=((0, 2, 64), (1, 1, 64)))), "claim.cells", "the cells hold 3 vCPUs, 2 are pinned"),
    (dict(c=claim(cells=((0, 1, 64), (1, 1, 32)))), "claim.cells", "the cells hold 96 pages, the claim 128"),
    (dict(boot=Boot()), "image", "needs a kernel, a root disk, or both"),
    (dict(boot=Boot(initrd="/i", disk="/d")), "image.kernel", "needs a kernel"),
    (dict(boot=Boot(kernel="vmlinuz")), "image.kernel", "not an absolute path"),
    (dict(boot=Boot(disk="/d", disk_format="vmdk")), "image.format", "not raw or qcow2"),
    (dict(s=spec("a", vcpus=2, disks=(DiskSpec("nvme0n1"),))), "disks", "1 disks asked, 0 claimed"),
    (dict(s=spec("a", vcpus=2, disks=(DiskSpec("x", IoTune(total_bytes_sec=1, read_bytes_sec=1)),)),
          c=claim(disks=(ClaimedDisk("nvme0n1", 1, 0),))),
     "disks[0].iotune.total_bytes_sec", "cannot be combined"),
    (dict(s=spec("a", vcpus=2, disks=(DiskSpec("x", IoTune(total_iops_sec_max_length=2)),)),
          c=claim(disks=(ClaimedDisk("nvme0n1", 0, 0),))),
     "disks[0].iotune.total_iops_sec_max_length", "needs total_iops_sec_max"),
    (dict(s=spec("a", vcpus=2, disks=(DiskSpec("x", IoTune(total_bytes_sec=1, group_name="a b")),)),
          c=claim(disks=(ClaimedDisk("nvme0n1", 1, 0),))), "disks[0].iotune.group_name", "letters"),
    (dict(s=spec("a", vcpus=2, disks=(DiskSpec("x"),)), c=claim(disks=(ClaimedDisk("../sda", 0, 0),))),
     "disks[0].disk", "not a kernel disk name"),
    (dict(c=claim(vfs=(ClaimedVf("ens9", 0, 0, 0, "52:54:00:01:02:03", 0),))), "vfs[0]",
     "no PCI address known for ens9 VF 0"),
    (dict(c=claim(vfs=(ClaimedVf("ens1f0", 0, 0, 0, "", 0),))), "vfs[0].mac", "fixed MAC"),
    (dict(c=claim(vfs=(ClaimedVf("ens1f0", 0, 0, 0, "52:54:00:01:02:03", 4095),))), "vfs[0].vlan", "4094"),
])
def test_refusals_name_the_field(change, field, reason) -> None:
    args = {**GOOD, **change}
    with pytest.raises(DomainDesignError) as e:
        build(args["s"], args["c"], args.get("boot", KERNEL), **args.get("host_kw", {}))
    assert e.value.field == field and reason in e.value.detail
    assert e.value.code == "hyb.vm.bad_domain"


def _block_node(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFBLK | 0o600, os.makedev(7, 200))


def _tree(tmp_path: Path, disk: str, block: bool) -> Path:
    root = tmp_path / "root"
    dev = root / "dev" / disk
    if block:
        _block_node(dev)
    else:
        dev.parent.mkdir(parents=True)
        dev.write_bytes(b"\0" * 512)  # an image file where a device should be
    return root


def test_check_host_refuses_a_disk_that_is_not_a_block_device(tmp_path: Path) -> None:
    dom = BY_NAME["tcg-qemu"].domain()
    root = _tree(tmp_path, "nvme0n1", block=False)
    with pytest.raises(DomainDesignError) as e:
        check_host(dom, root=root)
    assert e.value.field == "disks.nvme0n1" and "not a block device" in e.value.detail
    (root / "dev/nvme0n1").unlink()
    with pytest.raises(DomainDesignError, match="No such file"):
        check_host(dom, root=root)


def test_check_host_refuses_a_missing_kernel(tmp_path: Path) -> None:
    dom = dataclasses.replace(BY_NAME["minimal"].domain(), os=Os(kernel=str(tmp_path / "vmlinuz")))
    with pytest.raises(DomainDesignError) as e:
        check_host(dom, root=tmp_path)
    assert e.value.field == "image.kernel" and "is not a file" in e.value.detail


@pytest.mark.root
def test_check_host_accepts_block_devices(tmp_path: Path) -> None:
    dom = BY_NAME["tcg-qemu"].domain()
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"k")
    dom = dataclasses.replace(dom, os=dataclasses.replace(dom.os, kernel=str(kernel), initrd=str(kernel)))
    check_host(dom, root=_tree(tmp_path, "nvme0n1", block=True))


@pytest.mark.root
def test_design_domain_is_what_hostd_defines(tmp_path: Path) -> None:
    """The VmManager render path: metadata + image store image -> checked domain,
    console directory made, hostd's metadata element inside."""
    case: Case = BY_NAME["tcg-qemu"]
    root = _tree(tmp_path, "nvme0n1", block=True)
    files = {"kernel": tmp_path / "k/vmlinuz", "initrd": tmp_path / "k/initrd.img"}
    for p in files.values():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"kernel bits")
    image = ImageStore(tmp_path / "images").add("smoke", "1", "kernel", files, cmdline="console=ttyS0")
    md = case.metadata()
    h = dataclasses.replace(case.host, root=root, console_dir=tmp_path / "state/vms")
    dom = design_domain(md, image, h)
    assert (tmp_path / "state/vms/tcg-qemu").is_dir()
    assert dom.os.kernel == str(files["kernel"].resolve()) and dom.os.cmdline == "console=ttyS0"
    (meta,) = Domain.from_xml(dom.to_xml()).metadata
    assert NS in meta and VmMetadata.from_xml(meta) == md
    # the same claim and spec as the golden case, only the boot differs
    golden = case.domain()
    assert (dom.cputune, dom.numatune, dom.memory_backing, dom.devices.disks) == \
        (golden.cputune, golden.numatune, golden.memory_backing, golden.devices.disks)


def test_siblings_fixture_is_smt2() -> None:
    assert SIBLINGS[2] == (2, 10) and SIBLINGS[10] == (2, 10)


def test_failover_pair_standby_first_same_mac_teaming_and_aliases() -> None:
    """Issue 38 item 3 on the XML (this machine has no SR-IOV: the VF's PCI address is the
    recorded tree's): the standby virtio-net on the failover bridge, then the VF as its
    transient primary, one MAC; an interrupt VF carries only its alias."""
    d = BY_NAME["vf-failover"].domain()
    standby, primary, other = d.devices.interfaces
    assert (standby.bridge, standby.model, standby.mac, standby.teaming, standby.alias) == (
        "br-failover", "virtio", "52:54:00:12:34:57", Teaming("persistent"), "ua-vf0-standby")
    assert (str(primary.source), primary.mac, primary.teaming, primary.alias) == (
        "0000:3b:02.0", "52:54:00:12:34:57", Teaming("transient", "ua-vf0-standby"), "ua-vf0")
    assert (str(other.source), other.teaming, other.alias, other.vlan_tags) == ("0000:3b:02.1", None, "ua-vf1", (7,))
    plain = BY_NAME["vf-vlan"].domain().devices.interfaces[0]
    assert (plain.teaming, plain.alias) == (None, None)  # a VF that never moves: as before


@pytest.mark.parametrize("migration, host_kw, reason", [
    ("failover", {}, "failover needs a standby network on this host, and it has none: set failover_bridge"),
    ("teleport", {"failover_bridge": "br0"}, "'teleport' is not one of none, failover, interrupt"),
])
def test_a_vf_migration_the_host_cannot_render_is_refused_naming_the_field(migration, host_kw, reason) -> None:
    c = BY_NAME["vf-failover"]
    s = spec("vf-x", vcpus=2, memory_mib=1024, vfs=(VfReq(pf="ens1f0", mac="52:54:00:12:34:57",
                                                           migration=migration),))
    with pytest.raises(DomainDesignError) as e:
        Case("vf-x", s, KERNEL, host(**host_kw)).domain()
    assert e.value.field == "vfs[0].migration" and reason in e.value.detail
    assert c.domain()  # the same VF with a bridge renders
